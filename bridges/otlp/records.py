"""A request's log records as finished Logjam bodies, JSON bytes packed per resource: the
bridge's path (docs/protocols/otlp.md, "Mapping"; the "Speed" section has the costs).

A record's own fields are walked out of the parsed request into a small dict (its "head")
and encoded by orjson; what every record of a scope shares, `"resource"`, `"scope"` and
`"@metadata"` up to the record's index, is encoded once per scope into a template and
appended as bytes. The bodies of one resource are joined into one blob with their
lengths, the shape `Batches.add_packed` hands to the device link without copying a body
again. `engine.decode` (the records as dicts) rests on the same walk, so there is one
mapping.

A request is read in C (native/otlp_*.c) when it is built (LOGJAM_NATIVE): it walks the protobuf
wire bytes or the OTLP/JSON text and writes every record's body itself, with the text its
scope shares mapped here, once per scope, by the same functions the Python walk uses; what
it does not read exactly as upb and json_doc.py do it declines, and the Python walk below
answers. That walk parses protobuf with upb; OTLP/JSON it walks from orjson's document by
json_doc.py, which hands anything outside the plain shapes real exporters send back to
protobuf's own JSON parser (so its answers and its 400s stay exactly protobuf's).
"""

from __future__ import annotations

import functools
from array import array
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bridges.otlp import json_doc, values
from bridges.otlp.values import Mapped, Scope, any_value, app_env_of
from logjam import native as _native

__all__ = ["MODULE", "Mapped", "Packed", "encode", "walk"]

MODULE = "bridges.otlp._native_otlp"
# The C writes a request's bodies into one buffer kept from request to request (no fresh
# pages to zero and fault in each time); past this size a request gets a buffer of its own.
SCRATCH = 16 * 1024 * 1024
_STRING_VALUE = "string_value"
_ID_TAIL = b'"}}'  # after a record's index: the end of `_id`, of `@metadata`, of the body
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
           default_environment: str = "default", native: bool = True) -> list[Packed]:
    """The request's records as finished bodies, one `Packed` per resource: each body is the
    record's JSON object with `@metadata` = `metadata` and `_id` = `otlp:<key>:<index in the
    request>`, the same JSON as encoding the record's dict with that `@metadata`.

    The request goes to the C (native/otlp_*.c) when LOGJAM_NATIVE allows it and it was built (`native=False`:
    the Python walk whatever the switch says); anything it declines, to the Python walk."""
    meta = metadata_head(key, metadata)
    if native:
        built = _c_walk()
        if built is not None and (packed := built.encode(body, meta, default_environment, json=json)) is not None:
            return packed
    # Every % of the fixed text is escaped: the template is formatted with the record's index.
    template = meta.replace(b"%", b"%%") + b"%d" + _ID_TAIL
    return walk(body, lambda resources: _pack(resources, template, default_environment), json=json)


def metadata_head(key: str, metadata: dict[str, Any]) -> bytes:
    """`"@metadata":{...}` up to the record's index in `_id` (`_ID_TAIL` ends it)."""
    common = orjson.dumps({k: v for k, v in metadata.items() if k != "_id"}, default=str)[1:-1]
    return b'"@metadata":{' + (common + b"," if common else b"") + b'"_id":"otlp:' + orjson.dumps(key)[1:-1] + b":"


def shared_text(resource: bytes, scope: dict[str, Any]) -> bytes:
    """What every body of a scope holds after the record's own fields, up to `@metadata`:
    `resource` (the resource's `"resource":{...},`, encoded once per resource), then
    `"scope":{...},` when the scope has anything to say."""
    return resource + b'"scope":' + orjson.dumps(scope) + b"," if scope else resource


def resource_text(resource: dict[str, Any]) -> bytes:
    return b'"resource":' + orjson.dumps(resource) + b","


def _pack(resources: list[Mapped], meta: bytes, default_environment: str) -> list[Packed]:
    """Each record's head encoded and joined to its scope's shared text, as it is walked: no
    head outlives its record (fewer live objects, fewer collections of the cyclic GC)."""
    out: list[Packed] = []
    index = 0
    dumps = orjson.dumps
    for res in resources:
        resource = resource_text(res.resource)
        parts: list[bytes] = []
        lens, stamps = array("I"), array("q")
        for scope, recs, head_of in res.scopes:
            shared = shared_text(resource, scope).replace(b"%", b"%%") + meta
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
    attrs, resource = _resource(rl.resource, rl.schema_url)
    return Mapped(attrs, resource, [_scope_logs(sl) for sl in rl.scope_logs])


def _resource(r: Any, schema_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Resource (and its ResourceLogs' schema_url): its attributes, and its `"resource"` object."""
    attrs = _attributes(r.attributes)
    resource: dict[str, Any] = {"attributes": attrs}
    if r.dropped_attributes_count:
        resource["dropped_attributes_count"] = r.dropped_attributes_count
    if schema_url:
        resource["schema_url"] = schema_url
    return attrs, resource


def _scope_logs(sl: Any) -> Scope:
    return _scope(sl.scope, sl.schema_url), sl.log_records, _head


def _scope(s: Any, schema_url: str) -> dict[str, Any]:
    """An InstrumentationScope (and its ScopeLogs' schema_url) as its `"scope"` object."""
    scope: dict[str, Any] = {}
    if s.name:
        scope["name"] = s.name
    if s.version:
        scope["version"] = s.version
    if len(s.attributes):
        scope["attributes"] = _attributes(s.attributes)
    if schema_url:
        scope["schema_url"] = schema_url
    return scope


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


# -- in C (native/otlp_*.c)


class _CWalk:
    """The C (native/otlp_*.c) with its tables: `encode` gives what `_pack` gives for the same request, or
    None where the C declined (the Python walk then decides, a malformed body included).
    Its buffers are reused from call to call: one thread (the bridge's event loop) calls it."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib
        self._tables(16, 64)
        self._double_tables(0)
        self._n_scopes = ffi.new("int *")
        self._records = ffi.new("uint64_t *")
        self._close = ffi.new("uint32_t[]", 0)  # OTLP/JSON: the scan's index of the document
        self._scratch = bytearray()  # the bodies, written (SCRATCH)

    def _tables(self, resources: int, scopes: int) -> None:
        self._resources = self.ffi.new("lj_otlp_resource[]", resources)
        self._scopes = self.ffi.new("lj_otlp_scope[]", scopes)

    def _double_tables(self, n: int) -> None:
        self._doubles, self._spans = self.ffi.new("double[]", n), self.ffi.new("uint32_t[]", 2 * n)

    def encode(self, body: bytes, meta: bytes, default_environment: str, *, json: bool = False) -> list[Packed] | None:
        ffi, lib = self.ffi, self.lib
        scan, write = (lib.lj_otlp_json_scan, lib.lj_otlp_json_write) if json else (lib.lj_otlp_scan, lib.lj_otlp_write)
        buf = ffi.from_buffer(body)
        if json and len(self._close) < len(body):
            self._close = ffi.new("uint32_t[]", len(body))
        index = (self._close,) if json else ()
        while (n := scan(buf, len(body), *index, self._resources, len(self._resources), self._scopes,
                         len(self._scopes), self._n_scopes, self._records)) == lib.LJ_OTLP_ROOM:
            self._tables(2 * len(self._resources), max(2 * len(self._scopes), self._n_scopes[0]))
        if n < 0:
            return None
        n_scopes, count = self._n_scopes[0], self._records[0]
        scopes = self._scopes[0:n_scopes]
        # The text each scope's bodies share, mapped by the Python walk's own functions, once
        # per resource and once per scope.
        app_envs: list[str | None] = []
        shared: list[bytes] = []
        try:
            k = 0
            for r in self._resources[0:n]:
                attrs, resource = (_json_resource if json else _proto_resource)(body, r)
                app_envs.append(app_env_of(attrs, default_environment))
                text = resource_text(resource)
                for s in scopes[k : k + r.scopes]:
                    shared.append(shared_text(text, (_json_scope if json else _proto_scope)(body, s)) + meta)
                k += r.scopes
        except (DecodeError, RecursionError, ValueError, json_doc.Unsure):  # the Python walk words it
            return None
        # A record's body: at most 6 bytes per wire byte (a control character as \u00xx), 512 for
        # its own keys and numbers; lj_otlp_write checks it anyway.
        room = sum(s.records * (len(text) + 512 + len(_ID_TAIL)) + 6 * s.record_bytes for s, text in zip(scopes, shared))
        if room > len(self._scratch) and room <= SCRATCH:
            self._scratch = bytearray(room)
        blob = self._scratch if room <= len(self._scratch) else bytearray(room)
        lens, created, scope_ends = array("I", bytes(4 * count)), array("q", bytes(8 * count)), array("I", bytes(4 * n_scopes))
        texts, ends = b"".join(shared), _ends(shared)
        out = ffi.new("lj_otlp_out *", {
            "out": ffi.from_buffer(blob), "cap": len(blob), "lens": ffi.from_buffer("uint32_t[]", lens),
            "created_ms": ffi.from_buffer("int64_t[]", created), "scope_ends": ffi.from_buffer("uint32_t[]", scope_ends),
            "doubles": self._doubles, "double_spans": self._spans, "doubles_cap": len(self._doubles)})
        args = (buf, *index, self._scopes, n_scopes, texts, ffi.from_buffer("uint32_t[]", ends),
                _ID_TAIL, len(_ID_TAIL), out)
        written = write(*args)
        if written == lib.LJ_OTLP_DOUBLES:
            # Finite doubles: written as the Python walk writes them (orjson), from their text.
            met = out.doubles_met
            if met > len(self._doubles):
                self._double_tables(met)
                out.doubles, out.double_spans, out.doubles_cap = self._doubles, self._spans, met
                write(*args)
            try:
                if json:
                    spans = ffi.unpack(self._spans, 2 * met)
                    formatted = [json_doc.double_text(_span(body, a, n)) for a, n in zip(spans[0::2], spans[1::2])]
                else:
                    formatted = [orjson.dumps(d) for d in ffi.unpack(self._doubles, met)]
            except json_doc.Unsure:
                return None
            doubles_text, doubles_ends = b"".join(formatted), _ends(formatted)
            out.doubles_text, out.doubles_ends, out.doubles_given = (
                ffi.from_buffer(doubles_text), ffi.from_buffer("uint32_t[]", doubles_ends), met)
            written = write(*args)
        if written < 0:
            return None
        view = memoryview(blob)
        packed: list[Packed] = []
        first = start = k = 0
        for app_env, r in zip(app_envs, self._resources[0:n]):
            last = first + sum(s.records for s in scopes[k : k + r.scopes])
            k += r.scopes
            end = scope_ends[k - 1] if k else 0
            packed.append(Packed(app_env, bytes(view[start:end]), lens[first:last], created[first:last]))
            first, start = last, end
        return packed


def _ends(texts: list[bytes]) -> array:
    """Where each of `texts` ends when they are joined."""
    ends, pos = array("I", bytes(4 * len(texts))), 0
    for i, text in enumerate(texts):
        pos += len(text)
        ends[i] = pos
    return ends


def _span(body: bytes, off: int, n: int) -> bytes:
    return body[off : off + n]


def _proto_resource(body: bytes, r: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    resource = Resource.FromString(_span(body, r.resource_off, r.resource_len)) if r.has_resource else Resource()
    return _resource(resource, str(_span(body, r.schema_off, r.schema_len), "utf-8"))


def _proto_scope(body: bytes, s: Any) -> dict[str, Any]:
    scope = InstrumentationScope.FromString(_span(body, s.scope_off, s.scope_len)) if s.has_scope \
        else InstrumentationScope()
    return _scope(scope, str(_span(body, s.schema_off, s.schema_len), "utf-8"))


def _json_value(body: bytes, off: int, n: int, absent: Any) -> Any:
    """A JSON value the C found (n 0: not there)."""
    return orjson.loads(_span(body, off, n)) if n else absent


def _json_resource(body: bytes, r: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return json_doc.resource_of(_json_value(body, r.resource_off, r.resource_len if r.has_resource else 0, {}),
                                _json_value(body, r.schema_off, r.schema_len, ""))


def _json_scope(body: bytes, s: Any) -> dict[str, Any]:
    return json_doc.scope_of(_json_value(body, s.scope_off, s.scope_len if s.has_scope else 0, {}),
                             _json_value(body, s.schema_off, s.schema_len, ""))


def _c_walk() -> _CWalk | None:
    """The C walk when LOGJAM_NATIVE allows it and it was built (the switch is read anew each time)."""
    built = _native.load(MODULE)
    return None if built is None else _c_walk_of(*built)


@functools.cache
def _c_walk_of(ffi: Any, lib: Any) -> _CWalk:
    return _CWalk(ffi, lib)
