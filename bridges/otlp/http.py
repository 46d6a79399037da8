"""OTLP/HTTP on the host's TCP/TLS server: the thin adapter between a `Connection` and the
`OtlpServer` engine (bridges/otlp/engine.py, on h11), which frames `POST /v1/logs` requests
(protobuf or JSON, optionally gzip) and writes the answers.

A connection serves one request at a time (HTTP/1.1 keep-alive); each answer leaves once
`Bridge.export` has it, i.e. after the device's 202 for every record. The answers
(OTLP spec, "OTLP/HTTP Response"): 200 with an `ExportLogsServiceResponse` in the request's
content type (with `partial_success` when the device refused some records); 400 with a
`google.rpc.Status` for a malformed body or bytes that are not HTTP; 413 past
--max-frame-size (a Content-Length over it is refused before any body is read, and the
connection closes); 503 with `Retry-After` while the mesh holds input; 404, 405 and 415
for another path, method or content type.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from bridges.host import Connection, Host
from bridges.host.session import EngineSession
from bridges.otlp import engine
from logjam.errors import LocalProtocolError

# Bridge.export: a request's inflated body in, the answer it earned out.
Export = Callable[..., Awaitable[engine.Outcome]]


class HttpSession(EngineSession):
    """One client connection: request, answer, next request. It answers each request before
    reading the next, so it forwards without the host's `Pipeline` (Bridge.export waits)."""

    def __init__(self, host: Host, conn: Connection, export: Export, *, limit: int, retry_after: float) -> None:
        super().__init__(host, conn, engine.OtlpServer(limit, retry_after))
        self.export = export
        self.count_error: Callable[[str], Any] = host.metrics.protocol_error

    def done(self) -> bool:
        return self.engine.must_close

    def on_eof(self) -> None:
        self.engine.feed_eof()
        self.engine.feed(b"")  # a request left unfinished raises here

    async def on_events(self, events: list[engine.ExportRequest | engine.Refusal]) -> None:
        for event in events:
            await self._answer(event)
            if self.engine.must_close:
                break

    async def run(self) -> None:
        server = self.engine
        try:
            await self.read_loop()
        except engine.BadRequest as e:
            try:
                self.conn.write(server.send(engine.Refusal(400, str(e), True)))
            except LocalProtocolError:
                pass  # in the middle of an answer: nothing more can be said
            raise

    async def _answer(self, event: engine.ExportRequest | engine.Refusal) -> None:
        if isinstance(event, engine.Refusal):
            if event.status == 400:
                self.count_error(engine.BadRequest.reason)
            self.conn.write(self.engine.send(event))
            return
        transport = "http/json" if event.json else "http/protobuf"
        outcome = await self.export(event.body, json=event.json,
                                    metadata={**self.conn.metadata("1"), "transport": transport})
        self.conn.write(self.engine.send(outcome))
