"""native/otlp_*.c against its Python twin, records.py's walk (upb, or json_doc.py, then
orjson): for any bytes, protobuf or OTLP/JSON, the C gives exactly the bodies, lengths, times
and app-envs the Python walk gives, or it declines (and the Python walk answers); it never
answers where the Python walk refuses.

Hypothesis generates requests (tests/test_otlp_records.py's: every field, every AnyValue kind,
nesting, non-finite doubles, several resources and scopes), as protobuf and as OTLP/JSON in
each spelling, then mutates and cuts their bytes (and the JSON documents' values and keys);
hand-written bytes cover what the serializers never write (protobuf: fields out of order or
given twice, unknown fields, other wire types, groups, long varints, bad UTF-8; JSON:
escapes, numbers as text, ids in capitals, enum names, whitespace, base64 that is not
canonical). The C is under test whatever LOGJAM_NATIVE says (`c_module`: skipped under off).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

import orjson

from bridges.otlp import json_doc, records, values
from harness.native import c_module
from tests.test_otlp_records import METADATA, json_doc_only, mutated_json, otlp_json, requests

pytestmark = pytest.mark.native

KEY = "0123456789abcdef01234567"
ENV = "default"


def c_walk() -> Any:
    return records._CWalk(*c_module(records.MODULE))


def python(body: bytes, json: bool = False) -> Any:
    """The Python walk's answer: its Packed list, or ("bad", text)."""
    try:
        return records.encode(body, json=json, key=KEY, metadata=METADATA, default_environment=ENV, native=False)
    except values.BadRequest as e:
        return ("bad", str(e))


def native(walk: Any, body: bytes, json: bool = False) -> Any:
    """The C's answer: its Packed list, or None where it declined."""
    return walk.encode(body, records.metadata_head(KEY, METADATA), ENV, json=json)


def check(walk: Any, body: bytes, json: bool = False) -> bool:
    """The C gives the Python walk's answer or declines; whether it answered."""
    got, want = native(walk, body, json), python(body, json)
    if got is None:
        return False
    assert got == want
    return True


def mutate(body: bytes, data: st.DataObject) -> bytes:
    """1-3 bytes flipped, bytes inserted or deleted, or the rest cut off."""
    out = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(out)))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if how == "flip" and at < len(out):
            out[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "insert":
            out[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif how == "delete":
            del out[at : at + data.draw(st.integers(1, 3))]
        else:
            del out[at:]
    return bytes(out)


def key_lists(request: ExportLogsServiceRequest) -> Any:
    """The keys of each of the records' attribute lists and key-value lists (the resources' and
    scopes' are Python's to map)."""
    def lists(kvs: Any) -> Any:
        yield [kv.key for kv in kvs]
        for kv in kvs:
            yield from values_in(kv.value)

    def values_in(v: AnyValue) -> Any:
        kind = v.WhichOneof("value")
        if kind == "kvlist_value":
            yield from lists(v.kvlist_value.values)
        elif kind == "array_value":
            for x in v.array_value.values:
                yield from values_in(x)

    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                yield from lists(rec.attributes)
                yield from values_in(rec.body)


def has_duplicate_keys(request: ExportLogsServiceRequest) -> bool:
    """A key given twice in one list (the C declines those)."""
    return any(len(keys) != len(set(keys)) for keys in key_lists(request))


def escaped_keys(request: ExportLogsServiceRequest) -> bool:
    """A key that JSON writes with escapes (the C declines those in OTLP/JSON)."""
    return any(c < " " or c in '"\\' for keys in key_lists(request) for key in keys for c in key)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_generated_requests_give_the_python_walks_bodies(request: ExportLogsServiceRequest) -> None:
    body = request.SerializeToString()
    answered = check(c_walk(), body)
    # It declines only what it must (a key given twice); doubles and all the rest it writes.
    assert answered or has_duplicate_keys(request)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests.filter(lambda r: r.ByteSize() > 0), st.data())
def test_mutated_and_cut_bytes_give_the_python_walks_answer_or_are_declined(
        request: ExportLogsServiceRequest, data: st.DataObject) -> None:
    check(c_walk(), mutate(request.SerializeToString(), data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_the_python_walks_answer_or_are_declined(body: bytes) -> None:
    check(c_walk(), body)


def json_doc_takes(body: bytes) -> bool:
    """Whether json_doc walks it itself (else protobuf's JSON parser decides, and the C declines)."""
    try:
        json_doc_only(body)
    except (json_doc.Unsure, RecursionError):
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.booleans(), st.booleans(), st.booleans())
def test_generated_requests_as_otlp_json_give_the_python_walks_bodies(
        request: ExportLogsServiceRequest, snake: bool, enum_ints: bool, numbers: bool) -> None:
    body = orjson.dumps(otlp_json(request, snake=snake, enum_ints=enum_ints, numbers=numbers))
    answered = check(c_walk(), body, json=True)
    assert answered or has_duplicate_keys(request) or escaped_keys(request) or not json_doc_takes(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests.filter(lambda r: len(r.resource_logs) > 0), st.data())
def test_mutated_otlp_json_gives_the_python_walks_answer_or_is_declined(
        request: ExportLogsServiceRequest, data: st.DataObject) -> None:
    body = mutated_json(request, data)
    check(c_walk(), body, json=True)
    check(c_walk(), mutate(body, data), json=True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.text(alphabet='{}[]":,0123456789-eE.tfnrul \\', max_size=40).map(str.encode))
def test_arbitrary_bytes_as_otlp_json_give_the_python_walks_answer_or_are_declined(body: bytes) -> None:
    check(c_walk(), body, json=True)


def doc(*records: str, attrs: str = "") -> bytes:
    """An OTLP/JSON request of one resource and scope holding `records` (JSON text)."""
    resource = '{"attributes":[{"key":"service.name","value":{"stringValue":"shop"}}' + attrs + "]}"
    return ('{"resourceLogs":[{"resource":%s,"scopeLogs":[{"scope":{"name":"s"},"logRecords":[%s]}]}]}'
            % (resource, ",".join(records))).encode()


JSON_TAKEN = {
    "escapes, unescaped and escaped again as orjson does": doc(
        '{"body":{"stringValue":"a\\u0000\\/\\b\\f\\n\\r\\t\\"\\\\\\u00e9\\ud83d\\ude00\\u2028\\u001f\\u007f\\u0041"}}'),
    "raw UTF-8 and DEL as they are": doc('{"severityText":"é😀\x7f","eventName":"\\u007f"}'),
    "numbers as text": doc('{"timeUnixNano":"000000000000000000001","observedTimeUnixNano":18446744073709551615,'
                           '"droppedAttributesCount":"4294967295","flags":"-0","attributes":['
                           '{"key":"a","value":{"intValue":"-9223372036854775808"}},{"key":"b","value":{"intValue":-0}},'
                           '{"key":"c","value":{"intValue":"-00000000000000000001"}}]}'),
    "ids in capitals": doc('{"traceId":"0AF7651916CD43DD8448EB211C80319C","spanId":"B7AD6B7169203331"}'),
    "empty ids": doc('{"traceId":"","spanId":""}'),
    "enum names": doc('{"severityNumber":"SEVERITY_NUMBER_FATAL4"}', '{"severityNumber":"SEVERITY_NUMBER_UNSPECIFIED"}',
                      '{"severity_number":0}'),
    "whitespace everywhere": b' \n{ "resourceLogs" :\t[ { "scopeLogs" : [ { "logRecords" : [ { "body" : { "stringValue" '
                             b': "x" } , "attributes" : [ { "key" : "k" , "value" : { } } ] } ] } ] } ] }\r\n ',
    "unknown keys, every kind of value": doc('{"future":[1,{"a":null}],"x":null,"y":1.5e300,"z":"\\u0041",'
                                             '"body":{"stringValue":"a","later":true}}'),
    "doubles": doc('{"attributes":[' + ",".join('{"key":"d%d","value":{"doubleValue":%s}}' % (i, d) for i, d in enumerate(
        ["0", "-0", "1", "1.0", "1.50", "1e2", "-2.5E-3", "9007199254740992", "-9007199254740992", "1e300",
         "100000000000000000000000", "5e-324", "0.1"])) + "]}"),
    "base64": doc('{"attributes":[' + ",".join('{"key":"b%d","value":{"bytesValue":"%s"}}' % (i, b) for i, b in enumerate(
        ["", "AA==", "AAA=", "AAAA", "+/8=", "3q2+7w=="])) + "]}"),
    "arrays and key-value lists": doc('{"body":{"arrayValue":{"values":[{"kvlistValue":{"values":[{"key":"k",'
                                      '"value":{"arrayValue":{}}}]}},{"kvlistValue":{}},{},{"boolValue":false}]}}}'),
    "an empty attribute list, a key-value pair without a key": doc('{"attributes":[]}', '{"attributes":[{"value":{}}]}'),
    "snake_case": doc('{"time_unix_nano":"5000000","severity_text":"I","dropped_attributes_count":1,"event_name":"e",'
                      '"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331"}'),
    "no resource, no scope, no records": b'{"resourceLogs":[{},{"scopeLogs":[{}]},{"scopeLogs":[{"logRecords":[]}]}]}',
    "no resources": b'{"resourceLogs":[]}',
    "nothing": b"{}",
}

JSON_DECLINED = {
    "a key given twice": doc('{"attributes":[{"key":"k","value":{}},{"key":"k","value":{}}]}'),
    "a field in both spellings": doc('{"timeUnixNano":"1","time_unix_nano":"1"}'),
    "a field given twice": doc('{"flags":1,"flags":1}'),
    "an escaped key": doc('{"attributes":[{"key":"\\n","value":{}}]}'),
    "a number in an escaped string": doc('{"timeUnixNano":"\\u0031"}'),
    "a double past 2**53 written as an integer": doc('{"body":{"doubleValue":9007199254740993}}'),
    "a double as text": doc('{"body":{"doubleValue":"NaN"}}'),
    "a string index": doc('{"body":{"stringValueStrindex":1}}'),
    "base64 that is not canonical": doc('{"body":{"bytesValue":"AB=="}}'),
    "a null": doc('{"severityText":null}'),
    "an extension key": doc('{"[x.y]":1}'),
    "two members of the oneof": doc('{"body":{"stringValue":"a","intValue":"1"}}'),
    "a short id": doc('{"spanId":"b7ad"}'),
    "a number past its field": doc('{"flags":4294967296}'),
    "a severity past 24": doc('{"severityNumber":25}'),
    "a float for an integer": doc('{"timeUnixNano":1.0}'),
    "entity refs": b'{"resourceLogs":[{"resource":{"entityRefs":[]}}]}',
}

JSON_REFUSED = {
    "not JSON": b'{"resourceLogs":[}',
    "a trailing comma": b'{"resourceLogs":[],}',
    "bad UTF-8": doc('{"severityText":"X"}').replace(b"X", b"\xff"),
    "a lone surrogate": doc('{"severityText":"\\ud800"}'),
    "an id that is not hex": doc('{"traceId":"zz"}'),
    "a number out of range": doc('{"flags":-1}'),
    "a document that is not an object": b"[]",
    "trailing bytes": b"{} x",
}


@pytest.mark.parametrize("name", list(JSON_TAKEN))
def test_what_the_c_writes_itself_of_otlp_json(name: str) -> None:
    assert check(c_walk(), JSON_TAKEN[name], json=True), f"declined: {name}"


@pytest.mark.parametrize("name", list(JSON_DECLINED))
def test_what_the_c_leaves_to_the_python_walk_of_otlp_json(name: str) -> None:
    assert native(c_walk(), JSON_DECLINED[name], json=True) is None


@pytest.mark.parametrize("name", list(JSON_REFUSED))
def test_what_the_python_walk_refuses_of_otlp_json_the_c_declines(name: str) -> None:
    body = JSON_REFUSED[name]
    assert native(c_walk(), body, json=True) is None
    assert python(body, json=True)[0] == "bad"


# -- wire bytes protobuf's serializer never writes


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, wire: int, payload: bytes | int) -> bytes:
    """One field: tag, then a varint (wire 0), fixed bytes (1, 5) or length and bytes (2)."""
    head = varint(number << 3 | wire)
    if wire == 0:
        return head + varint(payload)  # type: ignore[arg-type]
    if wire == 2:
        return head + varint(len(payload)) + payload  # type: ignore[arg-type]
    return head + payload  # type: ignore[operator]


def wrap(*record_fields: bytes, resource: bytes = b"") -> bytes:
    """A request of one resource and one scope holding one record made of `record_fields`."""
    rec = b"".join(record_fields)
    scope = field(2, 2, rec)
    return field(1, 2, field(1, 2, resource) + field(2, 2, scope))


def any_string(s: bytes) -> bytes:
    return field(1, 2, s)


def kv(key: bytes, value: bytes | None) -> bytes:
    return field(1, 2, key) + (field(2, 2, value) if value is not None else b"")


def nested(depth: int) -> bytes:
    """An AnyValue: an array holding an array ... `depth` deep."""
    value = b""
    for _ in range(depth):
        value = field(5, 2, field(1, 2, value))
    return value


SERVICE = field(1, 2, kv(b"service.name", any_string(b"shop")))

TAKEN = {
    "fields in another order": wrap(field(11, 1, (7_000_000).to_bytes(8, "little")), field(3, 2, b"WARN"),
                                    field(6, 2, kv(b"b", any_string(b"2"))), field(5, 2, any_string(b"hi")),
                                    field(6, 2, kv(b"a", any_string(b"1"))), field(2, 0, 13)),
    "a scalar given twice: the last": wrap(field(3, 2, b"A"), field(3, 2, b"B"), field(2, 0, 5), field(2, 0, 9),
                                          field(1, 1, (1).to_bytes(8, "little")), field(1, 1, (9_000_000).to_bytes(8, "little"))),
    "unknown fields of every wire type": wrap(field(99, 0, 2**63), field(100, 1, bytes(8)), field(101, 2, b"\xff\xfe"),
                                              field(102, 5, bytes(4)), field(5, 2, any_string(b"x") + field(20, 0, 1))),
    "a severity as a long varint": wrap(b"\x10\x89\x80\x80\x80\x00"),
    "escapes": wrap(field(5, 2, any_string(bytes(range(0, 0x80)) + "é\u2028😀".encode()))),
    "a key-value pair without a value, or a key": wrap(field(6, 2, kv(b"k", None)), field(6, 2, field(2, 2, b""))),
    "an empty AnyValue body": wrap(field(5, 2, b"")),
    "the string index members": wrap(field(5, 2, field(8, 0, 3)), field(6, 2, kv(b"k", field(8, 0, 1)) + field(3, 0, 7))),
    "ids of any length": wrap(field(9, 2, b"\x01\x02\x03"), field(10, 2, b"\xab")),
    "int64 extremes and a true": wrap(field(6, 2, kv(b"min", field(3, 0, 2**63))), field(6, 2, kv(b"max", field(3, 0, 2**63 - 1))),
                                      field(6, 2, kv(b"t", field(2, 0, 1)))),
    "bytes of every length": wrap(*(field(6, 2, kv(b"b%d" % n, field(7, 2, bytes(range(250, 250 + n))))) for n in range(5))),
    "doubles": wrap(*(field(6, 2, kv(b"d%d" % i, field(4, 1, struct.pack("<d", d))))
                      for i, d in enumerate([0.0, -0.0, 1.5, 1e16, 1e-7, 5e-324, 1.7976931348623157e308,
                                             float("inf"), float("-inf"), float("nan")]))),
    "a record with nothing": wrap(),
    "a resource named": wrap(field(3, 2, b"x"), resource=SERVICE),
}

DECLINED = {
    "a key given twice": wrap(field(6, 2, kv(b"k", any_string(b"1"))), field(6, 2, kv(b"k", any_string(b"2")))),
    "two members of the oneof": wrap(field(5, 2, any_string(b"a") + field(3, 0, 1))),
    "a body given twice (merged)": wrap(field(5, 2, any_string(b"a")), field(5, 2, any_string(b"b"))),
    "a value given twice (merged)": wrap(field(6, 2, field(1, 2, b"k") + field(2, 2, b"") + field(2, 2, b""))),
    "a known field with another wire type": wrap(field(3, 0, 1)),
    "a group": wrap(b"\x9b\x06\x9c\x06"),
    "a negative severity": wrap(field(2, 0, 2**64 - 1)),
    "a severity past int32": wrap(field(2, 0, 2**31)),
    "a dropped count past uint32": wrap(field(7, 0, 2**32)),
    "a bool that is not 0 or 1": wrap(field(6, 2, kv(b"b", field(2, 0, 2)))),
    "nesting past the C's depth": wrap(field(5, 2, nested(20))),
    "two resources in one ResourceLogs (merged)": field(1, 2, field(1, 2, SERVICE) + field(1, 2, SERVICE)),
}

REFUSED = {
    "bad UTF-8 in a string": wrap(field(5, 2, any_string(b"\xff"))),
    "a surrogate in UTF-8": wrap(field(3, 2, b"\xed\xa0\x80")),
    "an overlong UTF-8 sequence": wrap(field(12, 2, b"\xc0\xaf")),
    "a key of bad UTF-8": wrap(field(6, 2, kv(b"\x80", None))),
    "a schema_url of bad UTF-8": field(1, 2, field(3, 2, b"\xfe")),
    "a length past the end": wrap(b"\x1a\x05ab"),
    "a field number 0": wrap(b"\x00\x01"),
    "an end group alone": wrap(b"\x0c"),
    "a varint of 11 bytes": wrap(b"\x10" + b"\xff" * 10 + b"\x01"),
    "wire type 7": wrap(b"\x0f"),
}


@pytest.mark.parametrize("name", list(TAKEN))
def test_what_the_c_writes_itself(name: str) -> None:
    assert check(c_walk(), TAKEN[name]), f"declined: {name}"


@pytest.mark.parametrize("name", list(DECLINED))
def test_what_the_c_leaves_to_the_python_walk(name: str) -> None:
    body = DECLINED[name]
    assert native(c_walk(), body) is None
    assert isinstance(python(body), list)  # a good request all the same


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_protobuf_refuses_the_c_declines(name: str) -> None:
    body = REFUSED[name]
    assert native(c_walk(), body) is None
    assert python(body)[0] == "bad"


def test_the_switch_chooses_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """records.encode takes the C under LOGJAM_NATIVE (not off), and the Python walk under off; same bytes."""
    c_module(records.MODULE)
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="shop"))]),
        scope_logs=[ScopeLogs(log_records=[LogRecord(body=AnyValue(kvlist_value=KeyValueList()))] * 3)])])
    body = request.SerializeToString()
    calls: list[bytes] = []
    encode = records._CWalk.encode
    monkeypatch.setattr(records._CWalk, "encode", lambda self, *a, **k: calls.append(a[0]) or encode(self, *a, **k))
    got = records.encode(body, json=False, key=KEY, metadata=METADATA)
    assert calls == [body] and got == python(body) and got[0].app_env == "shop-default"
    monkeypatch.setenv("LOGJAM_NATIVE", "off")
    assert records.encode(body, json=False, key=KEY, metadata=METADATA) == got and calls == [body]
