"""A request's log records as finished Logjam bodies, JSON bytes packed per resource: the
bridge's path (docs/protocols/otlp.md, "Mapping"; the "Speed" section has the costs).

A record's own fields are walked out of the parsed request into a small dict (its "head")
and encoded by orjson; what every record of a scope shares, `"resource"`, `"scope"` and
`"@metadata"` up to the record's index, is encoded once per scope into a template and
appended as bytes. The bodies of one resource are joined into one blob with their
lengths, the shape `Batches.add_packed` hands to the device link without copying a body
again. `engine.decode` (the records as dicts) rests on the same walk, so there is one
mapping.

Protobuf is parsed by upb; OTLP/JSON is walked from orjson's document by json_doc.py,
which hands anything outside the plain shapes real exporters send back to protobuf's own
JSON parser (so its answers and its 400s stay exactly protobuf's).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import orjson

from bridges.otlp import json_doc, values
from bridges.otlp.values import Mapped, Scope, any_value, app_env_of

__all__ = ["Mapped", "Packed", "encode", "walk"]

_STRING_VALUE = "string_value"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Packed:
    """One resource's records as finished bodies: `blob` is the bodies joined, `lens` their
    lengths, `created_ms` each record's time (0: none); `app_env` None: not named by the resource."""

    app_env: str | None
    blob: bytes
    lens: array
    created_ms: array


def walk(body: bytes, use: Callable[[list[Mapped]], T], *, json: bool = False) -> T:
    """`use` applied to every resource of one request (it walks each scope's records with the
    scope's head function); raises `BadRequest` for anything that is not a request.

    OTLP/JSON outside json_doc's plain shapes (json_doc.Unsure, raised as `use` meets it) goes
    to protobuf's own JSON parser and `use` starts again on that: so `use` keeps no state
    between calls."""
    if json:
        try:
            return use(json_doc.walk(body))
        except (json_doc.Unsure, RecursionError):
            request = values.parse_json(body)  # protobuf's parser decides (and words) what json_doc would not
    else:
        request = values.parse_proto(body)
    return use([_resource_logs(rl) for rl in request.resource_logs])


def encode(body: bytes, *, json: bool, key: str, metadata: dict[str, Any],
           default_environment: str = "default") -> list[Packed]:
    """The request's records as finished bodies, one `Packed` per resource: each body is the
    record's JSON object with `@metadata` = `metadata` and `_id` = `otlp:<key>:<index in the
    request>`, the same JSON as encoding the record's dict with that `@metadata`."""
    common = orjson.dumps({k: v for k, v in metadata.items() if k != "_id"}, default=str)[1:-1]
    # Every % of the fixed text is escaped: the template is formatted with the record's index.
    meta = (b'"@metadata":{' + (common + b"," if common else b"") + b'"_id":"otlp:').replace(b"%", b"%%")
    meta += orjson.dumps(key)[1:-1].replace(b"%", b"%%") + b':%d"}}'
    return walk(body, lambda resources: _pack(resources, meta, default_environment), json=json)


def _pack(resources: list[Mapped], meta: bytes, default_environment: str) -> list[Packed]:
    """Each record's head encoded and joined to its scope's shared text, as it is walked: no
    head outlives its record (fewer live objects, fewer collections of the cyclic GC)."""
    out: list[Packed] = []
    index = 0
    dumps = orjson.dumps
    for res in resources:
        resource = b'"resource":' + dumps(res.resource).replace(b"%", b"%%") + b","
        parts: list[bytes] = []
        lens, stamps = array("I"), array("q")
        for scope, recs, head_of in res.scopes:
            shared = resource + (b'"scope":' + dumps(scope).replace(b"%", b"%%") + b"," if scope else b"") + meta
            after_head = b"," + shared  # a head with fields: its last one, then ours
            for rec in recs:
                head, ms = head_of(rec)
                text = dumps(head)
                text = text[:-1] + after_head % index if len(text) > 2 else b"{" + shared % index
                parts.append(text)
                lens.append(len(text))
                stamps.append(ms)
                index += 1
        out.append(Packed(app_env_of(res.attributes, default_environment), b"".join(parts), lens, stamps))
    return out


# -- protobuf (upb) to heads


def _attributes(kvs: Any) -> dict[str, Any]:
    """`values.attributes`, with the common kinds read cheaply: upb answers an unset member of
    the oneof with its default, so a non-empty `string_value` (a non-zero `int_value`) is the
    value, without asking `WhichOneof`; anything else goes to `any_value`."""
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        if s := v.string_value:
            out[kv.key] = s
        elif i := v.int_value:
            out[kv.key] = i
        else:
            out[kv.key] = any_value(v)
    return out


def _resource_logs(rl: Any) -> Mapped:
    r = rl.resource
    attrs = _attributes(r.attributes)
    resource: dict[str, Any] = {"attributes": attrs}
    if r.dropped_attributes_count:
        resource["dropped_attributes_count"] = r.dropped_attributes_count
    if rl.schema_url:
        resource["schema_url"] = rl.schema_url
    return Mapped(attrs, resource, [_scope_logs(sl) for sl in rl.scope_logs])


def _scope_logs(sl: Any) -> Scope:
    s = sl.scope
    scope: dict[str, Any] = {}
    if s.name:
        scope["name"] = s.name
    if s.version:
        scope["version"] = s.version
    if len(s.attributes):
        scope["attributes"] = _attributes(s.attributes)
    if sl.schema_url:
        scope["schema_url"] = sl.schema_url
    return scope, sl.log_records, _head


def _head(rec: Any) -> tuple[dict[str, Any], int]:
    """A LogRecord's own fields, in the documented order, and its created_at (epoch ms)."""
    head: dict[str, Any] = {}
    b = rec.body
    if s := b.string_value:  # (see _attributes)
        head["message"] = s
    else:
        kind = b.WhichOneof("value")
        if kind == _STRING_VALUE:
            head["message"] = ""
        elif kind is not None:
            head["body"] = any_value(b)
    if v := rec.severity_text:
        head["severity_text"] = v
    if v := rec.severity_number:
        head["severity_number"] = v
    if len(attrs := rec.attributes):
        head["attributes"] = _attributes(attrs)
    if v := rec.dropped_attributes_count:
        head["dropped_attributes_count"] = v
    if v := rec.event_name:
        head["event_name"] = v
    if v := rec.trace_id:
        head["trace_id"] = v.hex()
    if v := rec.span_id:
        head["span_id"] = v.hex()
    if v := rec.flags:
        head["flags"] = v
    t = rec.time_unix_nano
    if t:
        head["time_unix_nano"] = t
    o = rec.observed_time_unix_nano
    if o:
        head["observed_time_unix_nano"] = o
    return head, (t or o) // 1_000_000

