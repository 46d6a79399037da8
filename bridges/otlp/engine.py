"""OTLP logs without I/O: a request body decoded into one `ResourceRecords` per resource (the
mapping, as dicts), the replies, and the OTLP/HTTP engine pair `OtlpServer` / `OtlpClient` (on h11).

The gRPC side (bridge.py) and the HTTP side (http.py, through `OtlpServer`) both hand the
bridge the request's bytes after the transport's own decompression, so one decoding step
serves protobuf over gRPC, protobuf over HTTP and OTLP/JSON over HTTP, and one Hypothesis
property covers it (tests/test_otlp_engine.py): arbitrary bytes give records or a
`RemoteProtocolError` subclass, nothing else. The bridge takes the records as finished
JSON bodies (records.py: `encode`); `decode` gives the same records as dicts, from the
same walk.

The wire types come from `opentelemetry-proto` (the project's generated code) and the
replies' `google.rpc` types from `googleapis-common-protos`, not from a hand-written codec;
HTTP/1.1 is h11's. (native/otlp_*.c read a request's records for speed, only where they read
them exactly as upb does: records.py.) OTLP/JSON is protobuf's JSON mapping with the OTLP spec's changes ("JSON
Protobuf Encoding"): trace and span ids are hex, not base64, and enums may be integers;
int64 values are strings. json_doc.py walks it; values.py has protobuf's own JSON parser
for what that walk leaves to it.

The mapping (docs/protocols/otlp.md) is records.py's: one JSON object per log record.
"""

from __future__ import annotations

import hashlib
from http import HTTPStatus
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import h11
import orjson
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bridges.otlp import records
from bridges.otlp.values import BadRequest, any_value, app_env_of, attributes, parse_proto
from logjam.compression import decompress
from logjam.errors import CompressionError, DecompressedTooLarge, HeldErrors, LocalProtocolError, ProtocolError
from logjam.meta import Compression

__all__ = [
    "BadRequest",
    "ExportLogsServiceResponse",
    "ExportRequest",
    "HttpResponse",
    "OtlpClient",
    "OtlpServer",
    "Refusal",
    "Outcome",
    "ResourceRecords",
    "TooLarge",
    "any_value",
    "app_env_of",
    "attributes",
    "client_reply",
    "client_request",
    "decode",
    "gunzip",
    "request_key",
    "response",
    "response_json",
]

class TooLarge(DecompressedTooLarge):
    """The request body (or what it inflates to) is over --max-frame-size."""

    reason = "otlp_too_large"


@dataclass(frozen=True, slots=True)
class ResourceRecords:
    """One `ResourceLogs` of a request: its app-env (None: not named by the resource) and
    each record's body (a JSON object) with its `created_at` in epoch ms (0: the record had no time)."""

    app_env: str | None
    bodies: tuple[dict[str, Any], ...]
    created_ms: tuple[int, ...]
    first: int  # index of this resource's first record in the whole request (for idempotency keys)


def gunzip(data: bytes, limit: int) -> bytes:
    """`data` inflated (gzip), refused past `limit` bytes before they are all allocated
    (logjam.compression's bounded inflate, whose zlib mode reads gzip headers too)."""
    try:
        return decompress(Compression.ZLIB, data, limit)
    except DecompressedTooLarge:
        raise TooLarge(f"gzip body inflates past {limit} bytes (--max-frame-size)") from None
    except CompressionError as e:
        raise BadRequest(f"gzip body does not inflate: {e}") from None


def decode(body: bytes, *, json: bool = False, default_environment: str = "default") -> list[ResourceRecords]:
    """Every resource of one request, mapped to dicts; raises `BadRequest` for anything else.
    (The bridge encodes the same walk straight to bytes: records.encode.)"""
    return records.walk(body, lambda resources: _as_dicts(resources, default_environment), json=json)


def _as_dicts(resources: list[records.Mapped], default_environment: str) -> list[ResourceRecords]:
    out: list[ResourceRecords] = []
    first = 0
    for res in resources:
        bodies: list[dict[str, Any]] = []
        created: list[int] = []
        for scope, recs, head_of in res.scopes:
            for rec in recs:
                head, ms = head_of(rec)
                # `resource` and `scope` are shared by the records of one resource and scope.
                head["resource"] = res.resource
                if scope:
                    head["scope"] = scope
                bodies.append(head)
                created.append(ms)
        out.append(ResourceRecords(app_env_of(res.attributes, default_environment), tuple(bodies), tuple(created), first))
        first += len(bodies)
    return out


def request_key(body: bytes) -> str:
    """A digest of the request's bytes: with a record's index, its idempotency key, the same
    on every retry of the same request (the exporters resend the bytes they serialized once)."""
    return hashlib.blake2b(body, digest_size=12).hexdigest()


# -- the replies


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one Export request earned: `kind` is ok, retry, bad or too_large."""

    kind: str
    rejected: int = 0
    message: str = ""


def response(rejected: int = 0, message: str = "") -> ExportLogsServiceResponse:
    """Success, or `partial_success` when some records were refused one by one."""
    if not rejected and not message:
        return ExportLogsServiceResponse()
    return ExportLogsServiceResponse(
        partial_success=ExportLogsPartialSuccess(rejected_log_records=rejected, error_message=message)
    )


def to_any_value(value: Any) -> AnyValue:
    """A JSON value as an AnyValue (the client half: `logjam-send otlp`)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[to_any_value(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=to_attributes(value)))
    if value is None:
        return AnyValue()
    return AnyValue(string_value=str(value))


def to_attributes(values: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=str(k), value=to_any_value(v)) for k, v in values.items()]


def client_request(events: Sequence[dict[str, Any]], resource: dict[str, str], observed_ns: int) -> bytes:
    """One ExportLogsServiceRequest of `events` under `resource` (the client half): an event's
    string `message` is the record's body and its other fields its attributes; an event
    without one is the body itself, as a key-value list."""
    records = []
    for event in events:
        message = event.get("message")
        if isinstance(message, str):
            rest = {k: v for k, v in event.items() if k != "message"}
            rec = LogRecord(body=AnyValue(string_value=message), attributes=to_attributes(rest))
        else:
            rec = LogRecord(body=to_any_value(event))
        rec.observed_time_unix_nano = observed_ns
        records.append(rec)
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=to_attributes(resource)),
        scope_logs=[ScopeLogs(scope=InstrumentationScope(name="logjam-send"), log_records=records)],
    )])
    return request.SerializeToString()


def client_reply(data: bytes) -> ExportLogsServiceResponse:
    """A server's ExportLogsServiceResponse (the client half); BadRequest when it is none."""
    return parse_proto(data, ExportLogsServiceResponse)


def response_json(message: Any) -> bytes:
    """A reply message as OTLP/JSON (lowerCamelCase names, int64 as strings)."""
    return orjson.dumps(json_format.MessageToDict(message))



# -- OTLP/HTTP framing: the engine pair (docs/architecture.md, "The engine contract")

PATH = b"/v1/logs"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_HEADERS = 64 * 1024
_STATUS_CODES = {400: 3, 404: 5, 405: 12, 413: 8, 415: 3, 503: 14}  # google.rpc.Code of each HTTP answer


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """A whole `POST /v1/logs`: its body, inflated, and whether it is OTLP/JSON."""

    body: bytes
    json: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered without an export (another path, method or type, a bad or too large
    body); as a reply, that answer. `close`: the rest of the request is not read."""

    status: int
    message: str
    close: bool = False


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """What an OtlpClient reads: the status, the headers (lowercase names) and the body."""

    status: int
    headers: dict[str, str]
    body: bytes


def _headers(items: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in items}


def _next_event(h: h11.Connection, what: str) -> Any:
    """h11's next event, or None when it has nothing more for now (or the peer closed)."""
    try:
        event = h.next_event()
    except h11.RemoteProtocolError as e:
        raise BadRequest(f"bad HTTP {what}: {e}") from None
    if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
        return None
    return event


class OtlpServer(HeldErrors):
    """OTLP/HTTP, server side, on h11: `feed(bytes)` gives ExportRequest and Refusal events
    (one request at a time: HTTP/1.1 answers in order, so the next request is read only
    after `send` answered this one), `send(Outcome | Refusal)` the answer's bytes.

    A body is bounded by `limit` before and after gzip; a Content-Length over it is refused
    at once and the rest not read (`must_close`). Bytes that are not HTTP raise `BadRequest`
    (the contract's rule: after the events before them); `send(Refusal(400, ..., True))`
    still answers them."""

    def __init__(self, limit: int = 4 * 1024 * 1024, retry_after: float = 1.0) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
        self._error: ProtocolError | None = None
        self._json = False  # the request being answered was OTLP/JSON
        self._refused: Refusal | None = None  # decided at the headers, answered at the end
        self._encoding = "identity"
        self._parts: list[bytes] = []
        self._size = 0
        self.must_close = False  # answered and to be closed; nothing more is read

    @property
    def mid_frame(self) -> bool:
        """A request has begun and is not complete (the adapter's --frame-timeout)."""
        return self.h.their_state is h11.SEND_BODY or (self.h.their_state is h11.IDLE and bool(self.h.trailing_data[0]))

    def feed(self, data: bytes) -> list[ExportRequest | Refusal]:
        self._raise_held()
        if data and not self.must_close:
            self.h.receive_data(data)
        return self._until_error(self._events())

    def feed_eof(self) -> None:
        """The client closed its side; a request it left unfinished is a BadRequest at the next feed."""
        if not self.must_close:
            self.h.receive_data(b"")

    def _events(self) -> Iterable[ExportRequest | Refusal]:
        while not self.must_close and self.h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            event = _next_event(self.h, "request")
            if event is None:
                return
            if isinstance(event, h11.Request):
                refusal = self._start(event)
                if refusal is not None and refusal.close:
                    yield refusal
                    return
            elif isinstance(event, h11.Data):
                self._size += len(event.data)
                if self._size > self.limit:
                    yield Refusal(413, f"the body is over {self.limit} bytes (--max-frame-size)", True)
                    return
                if self._refused is None:
                    self._parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                yield self._complete()
                return

    def _start(self, request: h11.Request) -> Refusal | None:
        headers = _headers(request.headers)
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        self._json = kind == JSON
        self._parts, self._size, self._refused = [], 0, None
        self._encoding = headers.get("content-encoding", "identity").strip().lower()
        target = request.target.split(b"?")[0]
        length = headers.get("content-length", "")
        if target != PATH:
            self._refused = Refusal(404, f"no such path: {target.decode('latin-1')}")
        elif request.method != b"POST":
            self._refused = Refusal(405, "only POST")
        elif kind not in (PROTOBUF, JSON):
            self._refused = Refusal(415, f"content type {kind!r}: use {PROTOBUF} or {JSON}")
        elif self._encoding not in ("identity", "gzip"):
            self._refused = Refusal(415, f"content encoding {self._encoding!r}: use gzip or none")
        elif length.isdigit() and int(length) > self.limit:
            return Refusal(413, f"the body is {length} bytes; the limit is {self.limit} (--max-frame-size)", True)
        return None

    def _complete(self) -> ExportRequest | Refusal:
        if self._refused is not None:
            return self._refused
        body = b"".join(self._parts)
        self._parts = []
        if self._encoding == "gzip":
            try:
                body = gunzip(body, self.limit)
            except TooLarge as e:
                return Refusal(413, str(e))
            except BadRequest as e:
                return Refusal(400, str(e))
        return ExportRequest(body, self._json)

    def send(self, reply: Outcome | Refusal) -> bytes:
        """The answer to the request in hand (or, after a BadRequest, to the bytes that were not HTTP)."""
        if self.h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise LocalProtocolError("no request to answer")
        extra: list[tuple[bytes, bytes]] = []
        if isinstance(reply, Refusal):
            status, message, close = reply.status, reply.message, reply.close or self._error is not None
            body = self._status(status, message)
            if status == 405:
                extra.append((b"allow", b"POST"))
        elif reply.kind == "ok":
            status, close = 200, False
            res = response(reply.rejected, reply.message)
            body = response_json(res) if self._json else res.SerializeToString()
        elif reply.kind == "retry":
            status, close = 503, False
            body = self._status(503, reply.message)
            extra.append((b"retry-after", str(max(1, round(self.retry_after))).encode()))
        else:
            status, close = (413 if reply.kind == "too_large" else 400), False
            body = self._status(status, reply.message)
        headers = [(b"content-type", (JSON if self._json else PROTOBUF).encode()),
                   (b"content-length", str(len(body)).encode()), *extra]
        if close:
            headers.append((b"connection", b"close"))
        try:
            out = self.h.send(h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode()))
            out += self.h.send(h11.Data(data=body))
            out += self.h.send(h11.EndOfMessage())  # type: ignore[operator]
        except h11.LocalProtocolError as e:
            raise LocalProtocolError(f"cannot answer: {e}") from None
        if close or h11.MUST_CLOSE in (self.h.our_state, self.h.their_state):
            self.must_close = True
        elif self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
        return out  # type: ignore[return-value]

    def _status(self, status: int, message: str) -> bytes:
        st = Status(code=_STATUS_CODES[status], message=message)
        return response_json(st) if self._json else st.SerializeToString()


class OtlpClient(HeldErrors):
    """OTLP/HTTP, client side, on h11 (`logjam-send otlp`, the tests): `send(body)` gives the
    bytes of one `POST /v1/logs`, `feed(bytes)` the responses."""

    def __init__(self, host: str = "localhost", *, json: bool = False) -> None:
        self.host = host
        self.json = json
        self.h = h11.Connection(h11.CLIENT)
        self._error: ProtocolError | None = None
        self._response: h11.Response | None = None
        self._parts: list[bytes] = []

    def send(self, body: bytes) -> bytes:
        if self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
        headers = [(b"host", self.host.encode()), (b"content-type", (JSON if self.json else PROTOBUF).encode()),
                   (b"content-length", str(len(body)).encode())]
        try:
            out = self.h.send(h11.Request(method=b"POST", target=PATH, headers=headers))
            out += self.h.send(h11.Data(data=body))
            out += self.h.send(h11.EndOfMessage())  # type: ignore[operator]
        except h11.LocalProtocolError as e:
            raise LocalProtocolError(f"cannot send a request now: {e}") from None
        return out  # type: ignore[return-value]

    def feed(self, data: bytes) -> list[HttpResponse]:
        self._raise_held()
        if data:
            self.h.receive_data(data)
        return self._until_error(self._responses())

    def _responses(self) -> Iterable[HttpResponse]:
        while (event := _next_event(self.h, "response")) is not None:
            if isinstance(event, h11.Response):
                self._response, self._parts = event, []
            elif isinstance(event, h11.Data):
                self._parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage) and self._response is not None:
                r, self._response = self._response, None
                yield HttpResponse(r.status_code, _headers(r.headers), b"".join(self._parts))
