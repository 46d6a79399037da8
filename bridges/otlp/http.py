"""OTLP/HTTP on the host's TCP/TLS server: `POST /v1/logs`, protobuf or JSON, optionally gzip.

HTTP/1.1 is parsed by h11 (a sans-IO engine, the house's model for protocol code, and
well kept), so this module only moves bytes between a `Connection` and h11 and decides
each answer. A connection serves one request at a time (keep-alive); the answer leaves
once `Bridge.export` has it, i.e. after the device's 202 for every record.

Answers (OTLP spec, "OTLP/HTTP Response"): 200 with an `ExportLogsServiceResponse` in the
request's content type (with `partial_success` when the device refused some records);
400 with a `google.rpc.Status` for a malformed body; 413 past --max-frame-size (a
Content-Length over it is refused before any body is read, and the connection closes);
503 with `Retry-After` while the mesh holds input; 404, 405 and 415 for another path,
method or content type.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Awaitable, Callable

import h11
from google.rpc import code_pb2, status_pb2

from bridges.host import Connection
from bridges.otlp import engine

# Bridge.export: a request's inflated body in, the answer it earned out.
Export = Callable[..., Awaitable[engine.Outcome]]

PATH = b"/v1/logs"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_HEADERS = 64 * 1024


class HttpSession:
    """One client connection: request, answer, next request."""

    def __init__(self, conn: Connection, export: Export, *, limit: int, retry_after: float,
                 count_error: Callable[[str], Any]) -> None:
        self.conn = conn
        self.export = export
        self.limit = limit
        self.retry_after = retry_after
        self.count_error = count_error
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
        # Inside a request the client must finish it within --frame-timeout (slowloris).
        conn.partial = lambda: self.h.their_state is h11.SEND_BODY or bool(self.h.trailing_data[0])

    async def run(self) -> None:
        while True:
            try:
                event = self.h.next_event()
            except h11.RemoteProtocolError as e:
                self._fail(400, f"bad HTTP request: {e}")
                raise engine.BadRequest(f"bad HTTP request: {e}") from None
            if event is h11.NEED_DATA:
                data = await self.conn.read()
                self.h.receive_data(data)
                if not data and self.h.their_state is h11.IDLE:
                    return
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                if not await self._request(event):
                    return
                if self.h.our_state is h11.MUST_CLOSE or self.h.their_state is h11.MUST_CLOSE:
                    return
                self.h.start_next_cycle()

    async def _request(self, request: h11.Request) -> bool:
        """Read the body and answer; False when the connection is to close."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        json = kind == JSON
        target = request.target.split(b"?")[0]
        if target != PATH:
            return await self._drain_and_answer(404, f"no such path: {target.decode('latin-1')}", json)
        if request.method != b"POST":
            return await self._drain_and_answer(405, "only POST", json, [(b"allow", b"POST")])
        if kind not in (PROTOBUF, JSON):
            return await self._drain_and_answer(415, f"content type {kind!r}: use {PROTOBUF} or {JSON}", False)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return await self._drain_and_answer(415, f"content encoding {encoding!r}: use gzip or none", json)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            self._fail(413, f"the body is {length} bytes; the limit is {self.limit} (--max-frame-size)", json)
            return False
        body = await self._body(json)
        if body is None:
            return False
        try:
            if encoding == "gzip":
                body = engine.gunzip(body, self.limit)
        except engine.TooLarge as e:
            self._answer(413, str(e), json)
            return True
        except engine.BadRequest as e:
            self.count_error(e.reason)
            self._answer(400, str(e), json)
            return True
        transport = "http/json" if json else "http/protobuf"
        outcome = await self.export(body, json=json, metadata={**self.conn.metadata("1"), "transport": transport})
        if outcome.kind == "ok":
            response = engine.response(outcome.rejected, outcome.message)
            self._send(200, engine.response_json(response) if json else response.SerializeToString(), json)
        elif outcome.kind == "retry":
            delay = max(1, round(self.retry_after))
            self._answer(503, outcome.message, json, [(b"retry-after", str(delay).encode())])
        else:
            self._answer(400, outcome.message, json)
        await self.conn.drain()
        return True

    async def _body(self, json: bool) -> bytes | None:
        """The whole body, or None after answering 413 (past the limit) or on a lost client."""
        parts: list[bytes] = []
        size = 0
        while True:
            event = self.h.next_event()
            if event is h11.NEED_DATA:
                data = await self.conn.read()
                if not data:
                    return None
                self.h.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limit:
                    self._fail(413, f"the body is over {self.limit} bytes (--max-frame-size)", json)
                    return None
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                return None

    async def _drain_and_answer(self, status: int, message: str, json: bool,
                                extra: list[tuple[bytes, bytes]] | None = None) -> bool:
        if await self._body(json) is None:
            return False
        self._answer(status, message, json, extra)
        await self.conn.drain()
        return True

    def _answer(self, status: int, message: str, json: bool, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        """An error answer: a google.rpc.Status in the request's content type."""
        code = {400: code_pb2.INVALID_ARGUMENT, 413: code_pb2.RESOURCE_EXHAUSTED, 503: code_pb2.UNAVAILABLE,
                404: code_pb2.NOT_FOUND, 405: code_pb2.UNIMPLEMENTED, 415: code_pb2.INVALID_ARGUMENT}[status]
        st = status_pb2.Status(code=code, message=message)
        self._send(status, engine.response_json(st) if json else st.SerializeToString(), json, extra)

    def _send(self, status: int, body: bytes, json: bool, extra: list[tuple[bytes, bytes]] | None = None,
              close: bool = False) -> None:
        headers = [(b"content-type", (JSON if json else PROTOBUF).encode()), (b"content-length", str(len(body)).encode()),
                   *(extra or [])]
        if close:
            headers.append((b"connection", b"close"))
        out = self.h.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode()))
        out += self.h.send(h11.Data(data=body))
        out += self.h.send(h11.EndOfMessage())
        self.conn.write(out)

    def _fail(self, status: int, message: str, json: bool = False) -> None:
        """Answer and close: the rest of the request is not read."""
        if self.h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            if status == 400:
                st = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message)
                self._send(400, st.SerializeToString(), False, close=True)
            else:
                st = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
                self._send(status, engine.response_json(st) if json else st.SerializeToString(), json, close=True)
        except h11.LocalProtocolError:
            pass
