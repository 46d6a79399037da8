"""The bridge's mapping of OTLP records to finished bodies (bridges/otlp/records.py, json_doc.py)
against the documented mapping (docs/protocols/otlp.md, "Mapping"), written here the plain way:
each record walked field by field out of protobuf into a dict (the code the bridge ran
before it encoded bodies straight to bytes), with `@metadata` added as `EventMapper.add` adds it.

Hypothesis generates ExportLogsServiceRequests (every field, every AnyValue kind, nesting,
non-finite doubles, several resources and scopes) and checks, per record, the JSON object,
created_ms, app-env and `_id`: protobuf bytes through `records.encode`, and the same request
as OTLP/JSON (camelCase or snake_case keys, int64 as strings or numbers, enums as integers
or names) through json_doc's walk, which must also take those plain shapes itself. Mutated
OTLP/JSON documents must give exactly what protobuf's own JSON parser gives: the same
records, or the same 400 text.
"""

from __future__ import annotations

import base64
import copy
import json
import math
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bridges.host.mapping import EventMapper
from bridges.otlp import engine, json_doc, records, values
from logjam.meta import Compression

KEY = "0123456789abcdef01234567"
METADATA = {"protocol": "otlp", "protocol_version": "1", "transport": "http/json", "peer": "10.0.0.1:5%d",
            "received_at": 1_700_000_000_000, "tls": {"subject": None, "cn": "a%sb"}}


# -- the oracle: the documented mapping, field by field


def oracle_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind in ("string_value", "int_value", "bool_value"):
        return getattr(v, kind)
    if kind == "double_value":
        return v.double_value if math.isfinite(v.double_value) else str(v.double_value)
    if kind == "array_value":
        return [oracle_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return oracle_attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def oracle_attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: oracle_value(kv.value) for kv in kvs}


def _set(message: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: value for name in names if (value := getattr(message, name))}


def oracle(request: ExportLogsServiceRequest, default_environment: str = "default") -> list[tuple[str | None, dict, int]]:
    """(app-env, body with @metadata, created_ms) of every record of the request, in order."""
    out = []
    for rl in request.resource_logs:
        attrs = oracle_attributes(rl.resource.attributes)
        resource = {"attributes": attrs, **_set(rl.resource, ("dropped_attributes_count",)), **_set(rl, ("schema_url",))}
        app_env = values.app_env_of(attrs, default_environment)
        for sl in rl.scope_logs:
            scope = _set(sl.scope, ("name", "version"))
            if len(sl.scope.attributes):
                scope["attributes"] = oracle_attributes(sl.scope.attributes)
            scope.update(_set(sl, ("schema_url",)))
            for rec in sl.log_records:
                body: dict[str, Any] = {}
                kind = rec.body.WhichOneof("value")
                if kind == "string_value":
                    body["message"] = rec.body.string_value
                elif kind is not None:
                    body["body"] = oracle_value(rec.body)
                body.update(_set(rec, ("severity_text", "severity_number")))
                if len(rec.attributes):
                    body["attributes"] = oracle_attributes(rec.attributes)
                body.update(_set(rec, ("dropped_attributes_count", "event_name")))
                if rec.trace_id:
                    body["trace_id"] = rec.trace_id.hex()
                if rec.span_id:
                    body["span_id"] = rec.span_id.hex()
                body.update(_set(rec, ("flags", "time_unix_nano", "observed_time_unix_nano")))
                body["resource"] = resource
                if scope:
                    body["scope"] = scope
                body["@metadata"] = {**METADATA, "_id": f"otlp:{KEY}:{len(out)}"}
                ms = (rec.time_unix_nano or rec.observed_time_unix_nano) // 1_000_000
                out.append((app_env, body, ms))
    return out


def encoded(body: bytes, json: bool) -> list[tuple[str | None, dict, int]]:
    """records.encode's output as (app-env, parsed body, created_ms) per record."""
    out = []
    for res in records.encode(body, json=json, key=KEY, metadata=METADATA):
        assert len(res.lens) == len(res.created_ms) and sum(res.lens) == len(res.blob)
        pos = 0
        for size, ms in zip(res.lens, res.created_ms):
            out.append((res.app_env, orjson.loads(res.blob[pos : pos + size]), ms))
            pos += size
    return out


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values (a NaN is never produced: non-finite doubles are text)."""
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(b, option=orjson.OPT_SORT_KEYS)


# -- generated requests

texts = st.text(max_size=12)
ids = st.sampled_from(["", "service.name", "deployment.environment.name", "deployment.environment", "k", "k2"])
leaf = st.one_of(
    st.builds(AnyValue),
    st.builds(lambda s: AnyValue(string_value=s), texts),
    st.builds(lambda b: AnyValue(bool_value=b), st.booleans()),
    st.builds(lambda i: AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda d: AnyValue(double_value=d), st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(lambda b: AnyValue(bytes_value=b), st.binary(max_size=8)),
)
any_values = st.recursive(leaf, lambda inner: st.one_of(
    st.builds(lambda vs: AnyValue(array_value=ArrayValue(values=vs)), st.lists(inner, max_size=3)),
    st.builds(lambda kvs: AnyValue(kvlist_value=KeyValueList(values=kvs)),
              st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), ids, inner), max_size=3)),
), max_leaves=6)
key_values = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), ids | texts, any_values), max_size=4)
resource_attributes = st.lists(st.one_of(
    st.builds(lambda k, s: KeyValue(key=k, value=AnyValue(string_value=s)), ids,
              st.sampled_from(["", "shop", "prod", "unknown_service:x", "a b"])),
    st.builds(lambda k, v: KeyValue(key=k, value=v), ids, any_values),
), max_size=4)
u64 = st.one_of(st.just(0), st.integers(0, 2**64 - 1), st.integers(1_600_000_000_000_000_000, 1_800_000_000_000_000_000))
u32 = st.one_of(st.just(0), st.integers(0, 2**32 - 1))
log_records = st.builds(
    LogRecord,
    time_unix_nano=u64, observed_time_unix_nano=u64, severity_number=st.integers(0, 24), severity_text=texts,
    body=st.one_of(st.builds(AnyValue), any_values), attributes=key_values, dropped_attributes_count=u32, flags=u32,
    trace_id=st.sampled_from([b"", bytes(16), bytes.fromhex("0af7651916cd43dd8448eb211c80319c")]),
    span_id=st.sampled_from([b"", bytes(8), bytes.fromhex("b7ad6b7169203331")]), event_name=texts,
)
scope_logs = st.builds(
    ScopeLogs,
    scope=st.builds(InstrumentationScope, name=texts, version=texts, attributes=key_values, dropped_attributes_count=u32),
    log_records=st.lists(log_records, max_size=3), schema_url=texts,
)
requests = st.builds(
    lambda rls: ExportLogsServiceRequest(resource_logs=rls),
    st.lists(st.builds(ResourceLogs,
                       resource=st.builds(Resource, attributes=resource_attributes, dropped_attributes_count=u32),
                       scope_logs=st.lists(scope_logs, max_size=3), schema_url=texts), max_size=3),
)


def otlp_json(request: ExportLogsServiceRequest, *, snake: bool, enum_ints: bool, numbers: bool) -> dict[str, Any]:
    """The request as OTLP/JSON: hex ids, int64 as strings (or as numbers), camelCase or snake_case keys."""
    doc = json_format.MessageToDict(request, preserving_proto_field_name=snake, use_integers_for_enums=enum_ints)

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k in ("traceId", "trace_id", "spanId", "span_id"):
                    out[k] = base64.b64decode(v).hex()
                elif numbers and isinstance(v, str) and k.lower().replace("_", "") in (
                        "intvalue", "timeunixnano", "observedtimeunixnano"):
                    out[k] = int(v)
                else:
                    out[k] = fix(v)
            return out
        if isinstance(node, list):
            return [fix(x) for x in node]
        return node

    return fix(doc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_protobuf_requests_map_as_documented(request: ExportLogsServiceRequest) -> None:
    got = encoded(request.SerializeToString(), False)
    assert same(got, oracle(request))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.booleans(), st.booleans(), st.booleans())
def test_the_same_requests_as_otlp_json_map_the_same_without_protobuf(
        request: ExportLogsServiceRequest, snake: bool, enum_ints: bool, numbers: bool) -> None:
    body = orjson.dumps(otlp_json(request, snake=snake, enum_ints=enum_ints, numbers=numbers))
    expected = oracle(request)
    assert same(encoded(body, True), expected)
    # json_doc takes these shapes itself (protobuf's parser is only for the unusual), except
    # what protobuf's JSON writes in shapes json_doc leaves to it: non-finite doubles as text.
    special = b'"NaN"' in body or b'"Infinity"' in body or b'"-Infinity"' in body
    if not special:
        without_metadata = [(a, {k: v for k, v in b.items() if k != "@metadata"}, ms) for a, b, ms in expected]
        assert same(json_doc_only(body), without_metadata)


def json_doc_only(body: bytes) -> list[tuple[str | None, dict, int]]:
    """The records as json_doc alone walks them (json_doc.Unsure if it leaves them to protobuf)."""
    return [(values.app_env_of(res.attributes, "default"),
             {**head, "resource": res.resource, **({"scope": scope} if scope else {})}, ms)
            for res in json_doc.walk(body) for scope, recs, head_of in res.scopes for head, ms in map(head_of, recs)]


def _reference(body: bytes) -> Any:
    """What the bridge did before json_doc: protobuf's JSON parser, then the documented mapping."""
    try:
        request = values.parse_json(body)
    except values.BadRequest as e:
        return ("bad", str(e))
    return oracle(request)


def _result(body: bytes) -> Any:
    try:
        return encoded(body, True)
    except values.BadRequest as e:
        return ("bad", str(e))


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, at + (i,))
    return out


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "0", "-1", "12", "1.5", "1e3", " 7", "0x10", "١٢", "SEVERITY_NUMBER_WARN", "NaN", "Infinity",
                     "AP8=", "AP8", "AP-_", "0af7651916cd43dd8448eb211c80319c", "B7AD6B7169203331", "zz", "[ext]"]),
    st.just([]), st.just({}), st.just([{}]), st.just({"stringValue": "x", "intValue": "1"}), st.just(["a"]),
)
SPELLINGS = {"timeUnixNano": "time_unix_nano", "traceId": "trace_id", "logRecords": "log_records",
             "scopeLogs": "scope_logs", "resourceLogs": "resource_logs", "stringValue": "string_value",
             "severityNumber": "severity_number", "intValue": "int_value", "schemaUrl": "schema_url"}


def mutated_json(request: ExportLogsServiceRequest, data: st.DataObject) -> bytes:
    """The request as OTLP/JSON with 1-3 values replaced by junk, keys respelled or extra keys added."""
    doc = otlp_json(request, snake=data.draw(st.booleans()), enum_ints=data.draw(st.booleans()), numbers=False)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        how = data.draw(st.sampled_from(["replace", "respell", "extra"]))
        if how == "respell" and isinstance(last, str) and last in SPELLINGS:
            parent[SPELLINGS[last]] = copy.deepcopy(data.draw(JUNK) if data.draw(st.booleans()) else parent[last])
        elif how == "extra" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["[x.y]", "future", "entityRefs", "stringValueStrindex"]))] = \
                copy.deepcopy(data.draw(JUNK))
        else:
            parent[last] = copy.deepcopy(data.draw(JUNK))  # a fresh value: `st.just` hands out one object
    return json.dumps(doc).encode()  # (orjson writes no integer past 64 bits; the stdlib does)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests.filter(lambda r: len(r.resource_logs) > 0), st.data())
def test_mutated_otlp_json_is_taken_or_refused_exactly_as_protobufs_parser_does(
        request: ExportLogsServiceRequest, data: st.DataObject) -> None:
    body = mutated_json(request, data)
    assert same(_result(body), _reference(body))


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZLIB])
@pytest.mark.parametrize("field", [None, "resource.attributes.team"])
def test_add_encoded_gives_what_add_gives(compression: int, field: str | None) -> None:
    kv = lambda k, v: KeyValue(key=k, value=AnyValue(string_value=v))  # noqa: E731
    request = ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(resource=Resource(attributes=[kv("service.name", "shop"), kv("team", "t-1")]),
                     scope_logs=[ScopeLogs(log_records=[LogRecord(time_unix_nano=5_000_000), LogRecord()])]),
        ResourceLogs(resource=Resource(attributes=[kv("team", "t-2")]), scope_logs=[ScopeLogs(log_records=[LogRecord()])]),
        ResourceLogs(resource=Resource(attributes=[kv("team", "bad name!")]), scope_logs=[ScopeLogs(log_records=[LogRecord()])]),
    ])
    mappers = [EventMapper(app_env="otlp-default", topic="logs.otlp", app_env_field=field, compression=compression)
               for _ in range(2)]
    old, new = mappers[0].batches(), mappers[1].batches()
    for app_env, body, ms in oracle(request):
        meta = body.pop("@metadata")
        mappers[0].add(old, body, meta, created_ms=ms or None, app_env=app_env)
    for res in records.encode(request.SerializeToString(), json=False, key=KEY, metadata=METADATA):
        mappers[1].add_encoded(new, res.blob, res.lens, res.created_ms, app_env=res.app_env)
    a, b = old.messages(), new.messages()
    assert [(m.app_env, m.topic, m.meta.compression) for m in a] == [(m.app_env, m.topic, m.meta.compression) for m in b]
    assert [m.app_env for m in b] == ["shop-default", "shop-default"] + (["t-2", "otlp-default"] if field else ["otlp-default"] * 2)
    assert [m.json() for m in a] == [m.json() for m in b]
    assert b[0].meta.created_ms == 5
    # No time: the receive time, as `add` gives.
    assert all(abs(x.meta.created_ms - y.meta.created_ms) < 5_000 for x, y in zip(a[1:], b[1:]))


def test_engine_decode_is_the_same_walk_as_dicts() -> None:
    kv = KeyValue(key="service.name", value=AnyValue(string_value="shop"))
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=[kv]), scope_logs=[ScopeLogs(log_records=[LogRecord(severity_number=9)] * 2)])])
    [res] = engine.decode(request.SerializeToString())
    want = [{k: v for k, v in body.items() if k != "@metadata"} for _, body, _ in oracle(request)]
    assert list(res.bodies) == want and res.app_env == "shop-default" and res.first == 0
