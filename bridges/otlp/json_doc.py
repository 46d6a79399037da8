"""OTLP/JSON walked straight from orjson's document into the mapping's pieces (values.Mapped),
without protobuf: hex ids, int64 as decimal strings (or numbers), enums as integers or names,
lowerCamelCase keys and the original snake_case ones, unknown keys ignored (OTLP spec,
"JSON Protobuf Encoding"; docs/protocols/otlp.md).

`walk` takes only the plain shapes, the ones whose meaning is certain, and raises `Unsure`
for anything else (a record's fields: when its user walks that record): a value of an
unexpected type, a null, a key given in both spellings, a number out of its field's range,
a base64 text that is not canonical, an extension key, a bad id.
The caller then parses the body with protobuf's own JSON parser (values.parse_json), so
every request outside the plain shapes, and every malformed one, is answered exactly as
protobuf decides, its 400 worded as before. tests/test_otlp_records.py checks on generated
requests that both routes agree.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import orjson
from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber

from bridges.otlp.values import Mapped, Scope

__all__ = ["Unsure", "double_text", "resource_of", "scope_of", "walk"]

_DECIMAL = re.compile(r"-?[0-9]{1,20}")
_SEVERITY_NAMES = {v.name: v.number for v in SeverityNumber.DESCRIPTOR.values}
_SEVERITY_MAX = max(_SEVERITY_NAMES.values())
_U32, _U64, _I64 = (0, 2**32 - 1), (0, 2**64 - 1), (-(2**63), 2**63 - 1)
_EXACT_FLOAT = 2**53  # an integer for a double: exactly the same double either way

# Each field's code under both of its names (protobuf's JSON takes either).
_REQUEST = {"resourceLogs": 1, "resource_logs": 1}
_RESOURCE_LOGS = {"resource": 1, "scopeLogs": 2, "scope_logs": 2, "schemaUrl": 3, "schema_url": 3}
_RESOURCE = {"attributes": 1, "droppedAttributesCount": 2, "dropped_attributes_count": 2,
             "entityRefs": 3, "entity_refs": 3}
_SCOPE_LOGS = {"scope": 1, "logRecords": 2, "log_records": 2, "schemaUrl": 3, "schema_url": 3}
_SCOPE = {"name": 1, "version": 2, "attributes": 3, "droppedAttributesCount": 4, "dropped_attributes_count": 4}
_KEY_VALUE = {"key": 1, "value": 2}
_VALUES = {"values": 1}
_ANY = {"stringValue": 1, "string_value": 1, "boolValue": 2, "bool_value": 2, "intValue": 3, "int_value": 3,
        "doubleValue": 4, "double_value": 4, "arrayValue": 5, "array_value": 5, "kvlistValue": 6,
        "kvlist_value": 6, "bytesValue": 7, "bytes_value": 7, "stringValueStrindex": 8, "string_value_strindex": 8}
_RECORD = {"timeUnixNano": 1, "time_unix_nano": 1, "observedTimeUnixNano": 11, "observed_time_unix_nano": 11,
           "severityNumber": 2, "severity_number": 2, "severityText": 3, "severity_text": 3, "body": 5,
           "attributes": 6, "droppedAttributesCount": 7, "dropped_attributes_count": 7, "flags": 8,
           "traceId": 9, "trace_id": 9, "spanId": 10, "span_id": 10, "eventName": 12, "event_name": 12}


_PLANS: dict[tuple[str, ...], tuple[str | None, ...]] = {}
_MAX_PLANS = 256


class Unsure(Exception):
    """Not a plain shape: protobuf's parser decides."""


def walk(body: bytes) -> list[Mapped]:
    """The request's resources, walked (each scope's records by `_head`, as its user goes);
    `Unsure`, now or from `_head`, when protobuf's parser must decide (see the module)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise Unsure from None
    if doc.__class__ is not dict:
        raise Unsure
    return [_resource_logs(rl) for rl in _list(_fields(doc, _REQUEST).get(1))]


def _fields(obj: Any, names: dict[str, int]) -> dict[int, Any]:
    """A message's known fields by code; unknown keys are ignored, as the bridge always did."""
    if obj.__class__ is not dict:
        raise Unsure
    out: dict[int, Any] = {}
    for key, value in obj.items():
        code = names.get(key)
        if code is None:
            if key[:1] == "[":  # extension syntax: protobuf refuses it
                raise Unsure
            continue
        if code in out or value is None:
            raise Unsure
        out[code] = value
    return out


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if value.__class__ is not list:
        raise Unsure
    return value


def _int(value: Any, bounds: tuple[int, int]) -> int:
    """An integer field: a JSON integer, or its decimal text (ASCII digits only: exactly what
    `int` and protobuf's parser read alike)."""
    kind = value.__class__
    if kind is str and (value.isdigit() and value.isascii() or _DECIMAL.fullmatch(value)) and len(value) <= 21:
        n = int(value)
    elif kind is int:
        n = value
    else:
        raise Unsure
    if not bounds[0] <= n <= bounds[1]:
        raise Unsure
    return n


def _str(value: Any) -> str:
    if value.__class__ is not str:
        raise Unsure
    return value


def _hex(value: Any, size: int) -> str:
    """A trace or span id as the mapping writes it (lowercase hex); "" when empty."""
    if value.__class__ is not str or (value and len(value) != 2 * size):
        raise Unsure
    try:
        return binascii.unhexlify(value).hex()
    except (binascii.Error, ValueError):
        raise Unsure from None


def _resource_logs(rl: Any) -> Mapped:
    f = _fields(rl, _RESOURCE_LOGS)
    attrs, resource = resource_of(f.get(1, {}), f.get(3, ""))
    return Mapped(attrs, resource, [_scope_logs(sl) for sl in _list(f.get(2))])


def resource_of(value: Any, schema_url: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Resource's JSON value (and its ResourceLogs' schemaUrl): its attributes, and its
    `"resource"` object (records._resource's); `Unsure` as the walk is."""
    r = _fields(value, _RESOURCE)
    if 3 in r:
        raise Unsure  # entity refs: not mapped, but protobuf checks them
    attrs = _attributes(r.get(1))
    resource: dict[str, Any] = {"attributes": attrs}
    if dropped := _int(r.get(2, 0), _U32):
        resource["dropped_attributes_count"] = dropped
    if schema := _str(schema_url):
        resource["schema_url"] = schema
    return attrs, resource


def _scope_logs(sl: Any) -> Scope:
    f = _fields(sl, _SCOPE_LOGS)
    return scope_of(f.get(1, {}), f.get(3, "")), _list(f.get(2)), _head


def scope_of(value: Any, schema_url: Any) -> dict[str, Any]:
    """An InstrumentationScope's JSON value (and its ScopeLogs' schemaUrl) as its `"scope"`
    object (records._scope's); `Unsure` as the walk is."""
    s = _fields(value, _SCOPE)
    scope: dict[str, Any] = {}
    if name := _str(s.get(1, "")):
        scope["name"] = name
    if version := _str(s.get(2, "")):
        scope["version"] = version
    if attrs := _attributes(s.get(3)):
        scope["attributes"] = attrs
    _int(s.get(4, 0), _U32)  # not mapped, but protobuf checks it
    if schema := _str(schema_url):
        scope["schema_url"] = schema
    return scope


def _plan(keys: tuple[str, ...]) -> tuple[str | None, ...]:
    """Which key of a record holds each field (indexed by field code), for records with these
    keys in this order: an exporter writes all its records alike, so this is worked out once."""
    plan = _PLANS.get(keys)
    if plan is None:
        fields: list[str | None] = [None] * 13
        for key in keys:
            code = _RECORD.get(key)
            if code is None:
                if key[:1] == "[":  # extension syntax: protobuf refuses it
                    raise Unsure
                continue
            if fields[code] is not None:  # both spellings
                raise Unsure
            fields[code] = key
        if len(_PLANS) >= _MAX_PLANS:  # bounded: a client choosing its keys cannot grow it
            _PLANS.clear()
        plan = _PLANS[keys] = tuple(fields)
    return plan


def _u64(value: Any) -> int:
    # Decimal text under 20 digits always fits: read without the general checks.
    if value.__class__ is str and len(value) < 20 and value.isdigit() and value.isascii():
        return int(value)
    return _int(value, _U64)


def _head(rec: Any) -> tuple[dict[str, Any], int]:
    """A LogRecord's own fields, in the documented order (records._head's), and its created_at."""
    if rec.__class__ is not dict:
        raise Unsure
    _, kt, ksev, ktext, _, kbody, kattrs, kdropped, kflags, ktrace, kspan, ko, kevent = _plan(tuple(rec))
    head: dict[str, Any] = {}
    if kbody is not None:
        value = rec[kbody]
        # The common body, {"stringValue": s}, read without a call.
        s = value.get("stringValue") if value.__class__ is dict and len(value) == 1 else None
        if s.__class__ is str:
            head["message"] = s
        else:
            kind, body = _any(value)
            if kind == 1:
                head["message"] = body
            elif kind:
                head["body"] = body
    if ktext is not None and (text := _str(rec[ktext])):
        head["severity_text"] = text
    if ksev is not None and (severity := _severity(rec[ksev])):
        head["severity_number"] = severity
    if kattrs is not None:
        if rec[kattrs] is None:
            raise Unsure
        if attrs := _attributes(rec[kattrs]):
            head["attributes"] = attrs
    if kdropped is not None and (dropped := _int(rec[kdropped], _U32)):
        head["dropped_attributes_count"] = dropped
    if kevent is not None and (event := _str(rec[kevent])):
        head["event_name"] = event
    if ktrace is not None and (trace := _hex(rec[ktrace], 16)):
        head["trace_id"] = trace
    if kspan is not None and (span := _hex(rec[kspan], 8)):
        head["span_id"] = span
    if kflags is not None and (flags := _int(rec[kflags], _U32)):
        head["flags"] = flags
    t = o = 0
    if kt is not None and (t := _u64(rec[kt])):
        head["time_unix_nano"] = t
    if ko is not None and (o := _u64(rec[ko])):
        head["observed_time_unix_nano"] = o
    return head, (t or o) // 1_000_000


def _severity(value: Any) -> int:
    if value.__class__ is int and 0 <= value <= _SEVERITY_MAX:
        return value  # type: ignore[no-any-return]
    if value.__class__ is str and value in _SEVERITY_NAMES:
        return _SEVERITY_NAMES[value]
    raise Unsure


def _attributes(kvs: Any) -> dict[str, Any]:
    """Key-value pairs as one object; a key given twice keeps its last value."""
    out: dict[str, Any] = {}
    for kv in _list(kvs):
        # The common pairs, {"key": k, "value": {"stringValue": s}} (or a short "intValue"), read
        # without a call: three per record from the SDKs, and the general path costs 1 us each.
        if kv.__class__ is dict and len(kv) == 2:
            key, value = kv.get("key"), kv.get("value")
            if key.__class__ is str and value.__class__ is dict and len(value) == 1:
                v = value.get("stringValue")
                if v.__class__ is str:
                    out[key] = v
                    continue
                v = value.get("intValue")
                if v.__class__ is str and len(v) < 19 and v.isdigit() and v.isascii():  # < 2**63
                    out[key] = int(v)
                    continue
        f = _fields(kv, _KEY_VALUE)
        out[_str(f.get(1, ""))] = _any(f[2])[1] if 2 in f else None
    return out


def _is_double(v: Any) -> bool:
    """A doubleValue: a JSON number orjson reads as a float, or an integer that is exactly one."""
    return v.__class__ is float or v.__class__ is int and -_EXACT_FLOAT <= v <= _EXACT_FLOAT


def double_text(number: bytes) -> bytes:
    """A doubleValue's JSON number (native/otlp_json.c hands it over) as the mapping writes it; `Unsure`
    where `_any` is."""
    v = orjson.loads(number)
    if not _is_double(v):
        raise Unsure
    return orjson.dumps(float(v))


def _any(value: Any) -> tuple[int, Any]:
    """An AnyValue: its kind's code (0: none) and its JSON value (values.any_value's)."""
    f = _fields(value, _ANY)
    if not f:
        return 0, None
    if len(f) > 1:
        raise Unsure  # two values of one oneof
    [(kind, v)] = f.items()
    c = v.__class__
    if kind == 1 and c is str or kind == 2 and c is bool:
        return kind, v
    if kind == 3:
        return kind, _int(v, _I64)
    if kind == 4:
        if _is_double(v):
            return kind, float(v)  # orjson never reads a non-finite number
    elif kind == 5:
        return kind, [_any(x)[1] for x in _list(_fields(v, _VALUES).get(1))]
    elif kind == 6:
        return kind, _attributes(_fields(v, _VALUES).get(1))
    elif kind == 7 and c is str:
        try:
            canonical = base64.b64encode(base64.b64decode(v, validate=True)).decode("ascii") == v
        except (binascii.Error, ValueError):
            canonical = False
        if canonical:
            return kind, v
    raise Unsure
