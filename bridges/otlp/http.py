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

from bridges.host import Connection
from bridges.otlp import engine
from logjam.errors import LocalProtocolError

# Bridge.export: a request's inflated body in, the answer it earned out.
Export = Callable[..., Awaitable[engine.Outcome]]


class HttpSession:
    """One client connection: request, answer, next request."""

    def __init__(self, conn: Connection, export: Export, *, limit: int, retry_after: float,
                 count_error: Callable[[str], Any]) -> None:
        self.conn = conn
        self.export = export
        self.count_error = count_error
        self.engine = engine.OtlpServer(limit, retry_after)

    async def run(self) -> None:
        server = self.engine
        try:
            while not server.must_close:
                # Inside a request the client must finish it within --frame-timeout (slowloris).
                data = await self.conn.read(mid_frame=server.mid_frame)
                if not data:
                    server.feed_eof()
                    server.feed(b"")  # a request left unfinished raises here
                    return
                events = server.feed(data)
                while events and not server.must_close:
                    for event in events:
                        await self._answer(event)
                        if server.must_close:
                            break
                    # The next request the client sent meanwhile, or an error held behind this one.
                    events = server.feed(b"") if not server.must_close else []
                await self.conn.drain()
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
