"""OTLP logs, decoded: an `ExportLogsServiceRequest` body in, one `ResourceRecords` per resource out.

No I/O here. The gRPC side (bridge.py) and the HTTP side (http.py) both hand this module
the request's bytes, after the transport's own decompression, so one decoding step serves
protobuf over gRPC, protobuf over HTTP and OTLP/JSON over HTTP, and one Hypothesis
property covers it (tests/test_otlp_engine.py): arbitrary bytes give records or a
`RemoteProtocolError` subclass, nothing else.

The wire types come from `opentelemetry-proto` (the project's generated code) and the
replies' `google.rpc` types from `googleapis-common-protos`, not from a hand-written codec.
OTLP/JSON is protobuf's JSON mapping with two changes (OTLP spec, "JSON Protobuf Encoding"):
trace and span ids are hex, not base64, and enums may be integers; int64 values are
strings (protobuf's JSON parser accepts that, and numbers too). `_hex_ids` turns the ids
into what `json_format` expects before parsing.

The mapping (docs/protocols/otlp.md) is `record_body`: one JSON object per log record.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from logjam.compression import decompress
from logjam.errors import CompressionError, DecompressedTooLarge, RemoteProtocolError
from logjam.meta import Compression
from logjam.validation import is_valid_app_env

__all__ = [
    "BadRequest",
    "ExportLogsServiceResponse",
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
    "record_body",
    "request_key",
    "response",
    "response_json",
]

SERVICE_NAME = "service.name"
ENVIRONMENT_KEYS = ("deployment.environment.name", "deployment.environment")


class BadRequest(RemoteProtocolError):
    """The request body is not an ExportLogsServiceRequest (protobuf or OTLP/JSON)."""

    reason = "otlp_malformed"


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
    """Every resource of one request, mapped; raises `BadRequest` for anything else."""
    request = _parse_json(body) if json else _parse_proto(body)
    out: list[ResourceRecords] = []
    first = 0
    for rl in request.resource_logs:
        attrs = attributes(rl.resource.attributes)
        resource: dict[str, Any] = {"attributes": attrs, **_present(rl.resource, ("dropped_attributes_count",)),
                                    **_present(rl, ("schema_url",))}
        bodies: list[dict[str, Any]] = []
        created: list[int] = []
        for sl in rl.scope_logs:
            scope = _scope(sl)
            for rec in sl.log_records:
                body, ms = record_body(rec, resource, scope)
                bodies.append(body)
                created.append(ms)
        out.append(ResourceRecords(app_env_of(attrs, default_environment), tuple(bodies), tuple(created), first))
        first += len(bodies)
    return out


def request_key(body: bytes) -> str:
    """A digest of the request's bytes: with a record's index, its idempotency key, the same
    on every retry of the same request (the exporters resend the bytes they serialized once)."""
    return hashlib.blake2b(body, digest_size=12).hexdigest()


def _parse_proto(body: bytes, kind: Any = ExportLogsServiceRequest) -> Any:
    try:
        return kind.FromString(body)
    except (DecodeError, RecursionError, ValueError) as e:
        raise BadRequest(f"not an {kind.__name__}: {e}") from None


def _parse_json(body: bytes) -> ExportLogsServiceRequest:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadRequest("an OTLP/JSON request is a JSON object")
    _hex_ids(value)
    try:
        return json_format.ParseDict(value, ExportLogsServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, ValueError, TypeError, AttributeError) as e:
        raise BadRequest(f"not an OTLP/JSON ExportLogsServiceRequest: {e}") from None


_ID_FIELDS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8}


def _hex_ids(request: dict[str, Any]) -> None:
    """OTLP/JSON's hex trace and span ids, rewritten in place as the base64 protobuf JSON has."""
    for rl in _objects(request.get("resourceLogs", request.get("resource_logs"))):
        for sl in _objects(rl.get("scopeLogs", rl.get("scope_logs"))):
            for rec in _objects(sl.get("logRecords", sl.get("log_records"))):
                for name, size in _ID_FIELDS.items():
                    value = rec.get(name)
                    if value is None or value == "":
                        rec.pop(name, None)
                        continue
                    if not isinstance(value, str) or len(value) != 2 * size:
                        raise BadRequest(f"{name} is not {2 * size} hex digits")
                    try:
                        raw = binascii.unhexlify(value)
                    except (binascii.Error, ValueError):
                        raise BadRequest(f"{name} is not hex") from None
                    rec[name] = base64.b64encode(raw).decode("ascii")


def _objects(value: Any) -> Iterable[dict[str, Any]]:
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    return ()


# -- the mapping


def any_value(v: AnyValue) -> Any:
    """An AnyValue as a JSON value: bytes as base64 text, a non-finite double as its name."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        d = v.double_value
        return d if math.isfinite(d) else str(d)
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """Key-value pairs as one object; a key given twice keeps its last value."""
    return {kv.key: any_value(kv.value) for kv in kvs}


def _present(message: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of `message` named in `names` that are set (not zero, not empty)."""
    return {name: value for name in names if (value := getattr(message, name))}


def _scope(sl: Any) -> dict[str, Any]:
    s = sl.scope
    scope = _present(s, ("name", "version"))
    if len(s.attributes):
        scope["attributes"] = attributes(s.attributes)
    scope.update(_present(sl, ("schema_url",)))
    return scope


def record_body(rec: Any, resource: dict[str, Any], scope: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """One LogRecord as the body of its Logjam message (a JSON object), and its `created_at`
    (epoch ms). `resource` and `scope` are shared by the records of one resource and scope."""
    body: dict[str, Any] = {}
    kind = rec.body.WhichOneof("value")
    if kind == "string_value":
        body["message"] = rec.body.string_value
    elif kind is not None:
        body["body"] = any_value(rec.body)
    body.update(_present(rec, ("severity_text", "severity_number")))
    if len(rec.attributes):
        body["attributes"] = attributes(rec.attributes)
    body.update(_present(rec, ("dropped_attributes_count", "event_name")))
    if rec.trace_id:
        body["trace_id"] = rec.trace_id.hex()
    if rec.span_id:
        body["span_id"] = rec.span_id.hex()
    body.update(_present(rec, ("flags", "time_unix_nano", "observed_time_unix_nano")))
    body["resource"] = resource
    if scope:
        body["scope"] = scope
    ns = rec.time_unix_nano or rec.observed_time_unix_nano
    return body, ns // 1_000_000


def app_env_of(resource: dict[str, Any], default_environment: str) -> str | None:
    """`<service.name>-<deployment.environment.name>` (or the older `deployment.environment`;
    without either, `default_environment`); None when the resource names no service (an SDK's
    `unknown_service*` default counts as none) or the name is no valid stream name."""
    service = resource.get(SERVICE_NAME)
    if not isinstance(service, str) or not service or service.startswith("unknown_service"):
        return None
    env = next((e for k in ENVIRONMENT_KEYS if isinstance(e := resource.get(k), str) and e), default_environment)
    name = f"{service}-{env}"
    return name if is_valid_app_env(name) else None


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
    return _parse_proto(data, ExportLogsServiceResponse)


def response_json(message: Any) -> bytes:
    """A reply message as OTLP/JSON (lowerCamelCase names, int64 as strings)."""
    return orjson.dumps(json_format.MessageToDict(message))

