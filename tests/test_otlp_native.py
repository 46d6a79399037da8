"""native/otlp.c against its Python twin, records.py's walk (upb, then orjson): for any bytes,
the C gives exactly the bodies, lengths, times and app-envs the Python walk gives, or it
declines (and the Python walk answers); it never answers where the Python walk refuses.

Hypothesis generates requests (tests/test_otlp_records.py's: every field, every AnyValue kind,
nesting, non-finite doubles, several resources and scopes), then mutates and cuts their wire
bytes; hand-written wire bytes cover what protobuf's own serializer never writes (fields out
of order or given twice, unknown fields, other wire types, groups, long varints, bad UTF-8).
The C is under test whatever LOGJAM_NATIVE says (`c_module`: skipped under off).
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

from bridges.otlp import records, values
from harness.native import c_module
from tests.test_otlp_records import METADATA, requests

pytestmark = pytest.mark.native

KEY = "0123456789abcdef01234567"
ENV = "default"


def c_walk() -> Any:
    return records._CWalk(*c_module(records.MODULE))


def python(body: bytes) -> Any:
    """The Python walk's answer: its Packed list, or ("bad", text)."""
    try:
        return records.encode(body, json=False, key=KEY, metadata=METADATA, default_environment=ENV, native=False)
    except values.BadRequest as e:
        return ("bad", str(e))


def native(walk: Any, body: bytes) -> Any:
    """The C's answer: its Packed list, or None where it declined."""
    return walk.encode(body, records.metadata_head(KEY, METADATA), ENV)


def check(walk: Any, body: bytes) -> bool:
    """The C gives the Python walk's answer or declines; whether it answered."""
    got, want = native(walk, body), python(body)
    if got is None:
        return False
    assert got == want
    return True


def has_duplicate_keys(request: ExportLogsServiceRequest) -> bool:
    """A key given twice in one record's attributes or one key-value list (the C declines those)."""
    def lists(kvs: Any) -> Any:
        yield kvs
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
                for kvs in [*lists(rec.attributes), *values_in(rec.body)]:
                    keys = [kv.key for kv in kvs]
                    if len(keys) != len(set(keys)):
                        return True
    return False


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
    body = bytearray(request.SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body)))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if how == "flip" and at < len(body):
            body[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif how == "delete":
            del body[at : at + data.draw(st.integers(1, 3))]
        else:
            del body[at:]
    check(c_walk(), bytes(body))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_the_python_walks_answer_or_are_declined(body: bytes) -> None:
    check(c_walk(), body)


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
    monkeypatch.setattr(records._CWalk, "encode", lambda self, *a: calls.append(a[0]) or encode(self, *a))
    got = records.encode(body, json=False, key=KEY, metadata=METADATA)
    assert calls == [body] and got == python(body) and got[0].app_env == "shop-default"
    monkeypatch.setenv("LOGJAM_NATIVE", "off")
    assert records.encode(body, json=False, key=KEY, metadata=METADATA) == got and calls == [body]
