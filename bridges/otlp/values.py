"""OTLP's values without I/O: parsing a request body (protobuf, or OTLP/JSON through protobuf's
own JSON parser), AnyValue as a JSON value, and a resource's app-env (docs/protocols/otlp.md).

The pieces the mapping (records.py), the OTLP/JSON walk (json_doc.py) and the engine share,
kept below all three so that none imports another in a circle.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from logjam.errors import RemoteProtocolError
from logjam.validation import is_valid_app_env

__all__ = ["BadRequest", "Mapped", "Scope", "any_value", "app_env_of", "attributes", "parse_json", "parse_proto"]

SERVICE_NAME = "service.name"
ENVIRONMENT_KEYS = ("deployment.environment.name", "deployment.environment")


# A scope, walked: its `"scope"` object, its records as they came (protobuf messages or JSON
# objects), and the function giving a record's head (its own fields, as the mapping writes
# them) and `created_at` in epoch ms (0: the record had no time).
Scope = tuple[dict[str, Any], Sequence[Any], Callable[[Any], tuple[dict[str, Any], int]]]


@dataclass(slots=True)
class Mapped:
    """One `ResourceLogs`, walked: the resource's attributes (for the app-env), its
    `"resource"` object, and its scopes, whose records are walked one by one by the user."""

    attributes: dict[str, Any]
    resource: dict[str, Any]
    scopes: list[Scope]


class BadRequest(RemoteProtocolError):
    """The request body is not an ExportLogsServiceRequest (protobuf or OTLP/JSON)."""

    reason = "otlp_malformed"


def parse_proto(body: bytes, kind: Any = ExportLogsServiceRequest) -> Any:
    """`body` parsed as a `kind` (upb); BadRequest when it is none."""
    try:
        return kind.FromString(body)
    except (DecodeError, RecursionError, ValueError) as e:
        raise BadRequest(f"not an {kind.__name__}: {e}") from None


def parse_json(body: bytes) -> ExportLogsServiceRequest:
    """OTLP/JSON through protobuf's JSON parser, after `_hex_ids`; BadRequest when it is no request."""
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
