"""The sans-IO RustLog engine: vectors whole, byte by byte and with trailing data; limits; a property."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings, strategies as st

from bridges.rustlog import engine as e
from logjam.errors import FrameTooLarge, LocalProtocolError, ProtocolError, RemoteProtocolError

J, B = e.Dialect.JSON, e.Dialect.BINARY


def fr(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


# Request vectors, written from the spec tables byte for byte.
REQUESTS: list[tuple[bytes, e.Request]] = [
    (b'{"type":"Produce","topic":"logs","partition":0,"records":["SGVsbG8gV29ybGQ="]}',
     e.Produce("logs", 0, (b"Hello World",), J)),
    (b'{"type":"Produce","topic":"user-events","partition":3,"records":[]}', e.Produce("user-events", 3, (), J)),
    (b'{"type":"Fetch","group_id":"analytics-consumer","topic":"user-events","partition":0,"offset":100,"max_bytes":1048576}',
     e.Fetch("user-events", 0, 100, 1048576, "analytics-consumer", J)),
    (b'{"type":"OffsetCommit","group":"analytics-pipeline","topic":"user-events","partition":0,"offset":150}',
     e.OffsetCommit("analytics-pipeline", "user-events", 0, 150, J)),
    (b'{"type":"OffsetFetch","group":"g","topic":"t","partition":1}', e.OffsetFetch("g", "t", 1, J)),
    (b'{"type":"CreateTopic","topic":"t_1","partition_count":1000}', e.CreateTopic("t_1", 1000, J)),
    (b'{"type":"ListTopics"}', e.ListTopics(J)),
    (b'{"type":"DescribeTopic","topic":"t"}', e.DescribeTopic("t", J)),
    (b'{"type":"DescribePartition","topic":"t","partition":4294967295}', e.DescribePartition("t", 4294967295, J)),
    (b'{"type":"MetricsFetch"}', e.MetricsFetch(J)),
    (b'{"type":"Ping","extra":"ignored"}', e.Ping(J)),
    (b"\x01" + s("logs") + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x02" + b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x03\xff\x00c",
     e.Produce("logs", 2, (b"a", b"\xff\x00c"), B)),
    (b"\x02" + s("grp") + s("t") + b"\x00\x00\x00\x01" + struct.pack(">Q", 2**64 - 1) + b"\x00\x01\x00\x00",
     e.Fetch("t", 1, 2**64 - 1, 65536, "grp", B)),
    (b"\x03" + s("g") + s("t") + b"\x00\x00\x00\x00" + struct.pack(">Q", 7), e.OffsetCommit("g", "t", 0, 7, B)),
    (b"\x04" + s("g") + s("t") + b"\x00\x00\x00\x05", e.OffsetFetch("g", "t", 5, B)),
    (b"\x05" + s("new-topic") + b"\x00\x00\x00\x03", e.CreateTopic("new-topic", 3, B)),
    (b"\x06", e.ListTopics(B)),
    (b"\x07" + s("t"), e.DescribeTopic("t", B)),
    (b"\x08" + s("t") + b"\x00\x00\x00\x09", e.DescribePartition("t", 9, B)),
    (b"\x09", e.MetricsFetch(B)),
    (b"\xff", e.Ping(B)),
]


def test_spec_example_frame() -> None:
    # The spec's example says "74 bytes", but its payload is 78 (docs/protocols/rustlog.md); the header carries the real length.
    assert fr(REQUESTS[0][0])[:4] == b"\x00\x00\x00\x4e"


@pytest.mark.parametrize("payload,event", REQUESTS, ids=lambda v: type(v).__name__ if not isinstance(v, bytes) else None)
def test_request_vectors_whole_bytewise_and_with_trailing_data(payload: bytes, event: e.Request) -> None:
    data = fr(payload)
    assert e.RustlogServer().feed(data) == [event]

    conn = e.RustlogServer()
    got = []
    for i in range(len(data)):
        got += conn.feed(data[i:i + 1])
    assert got == [event]

    conn = e.RustlogServer()
    nxt = fr(b'{"type":"Ping"}')
    assert conn.feed(data + nxt[:3]) == [event]
    assert conn.feed(nxt[3:]) == [e.Ping(J)]


def test_client_encodes_the_same_vectors() -> None:
    client = e.RustlogClient()
    for payload, event in REQUESTS:
        if event.dialect is B:
            assert client.send(event) == fr(payload)
        else:
            assert e.RustlogServer().feed(client.send(event)) == [event]


# Binary response vectors from the interop table.
BINARY_RESPONSES: list[tuple[e.Response, bytes]] = [
    (e.ProduceResponse(42, 2), b"\x01" + struct.pack(">QI", 42, 2)),
    (e.FetchResponse((e.FetchedRecord(b"ab", 5, 1), e.FetchedRecord(b"", 6, 1)), 7),
     b"\x02\x00\x00\x00\x02\x00\x00\x00\x02ab\x00\x00\x00\x00" + struct.pack(">Q", 7)),
    (e.OffsetCommitResponse(True), b"\x03\x01"),
    (e.OffsetFetchResponse(None), b"\x04\x00"),
    (e.OffsetFetchResponse(9), b"\x04\x01" + struct.pack(">Q", 9)),
    (e.CreateTopicResponse(True, 3), b"\x05\x01"),
    (e.ListTopicsResponse((e.TopicInfo("a", 1), e.TopicInfo("bc", 2))), b"\x06\x00\x00\x00\x02" + s("a") + b"\x00\x00\x00\x01" + s("bc") + b"\x00\x00\x00\x02"),
    (e.DescribeTopicResponse("t", (e.PartitionInfo(0, 10, 2, 3), e.PartitionInfo(1, 0, 0, 1))),
     b"\x07" + s("t") + b"\x00\x00\x00\x02\x00\x00\x00\x02" + struct.pack(">IQIQ", 0, 10, 1, 0)),
    (e.DescribePartitionResponse("t", e.PartitionInfo(1, 10, 2, 3)), b"\x08" + s("t") + struct.pack(">IQ", 1, 10)),
    (e.MetricsResponse({"x": 1}, "rustlog_x 1\n"), b"\x09\x00\x00\x00\x0crustlog_x 1\n"),
    (e.Pong(), b"\xff"),
    (e.Error(e.ErrorKind.TOPIC_EXISTS, "exists"), b"\xfe\x00\x0b" + s("exists")),
]


@pytest.mark.parametrize("response,payload", BINARY_RESPONSES, ids=lambda v: type(v).__name__ if not isinstance(v, bytes) else None)
def test_binary_responses(response: e.Response, payload: bytes) -> None:
    server = e.RustlogServer()
    server.feed(fr(b"\xff"))
    assert server.send(response) == fr(payload)
    # The client half reads it whole and byte by byte.
    decoded = e.RustlogClient().feed(fr(payload))
    client = e.RustlogClient()
    bytewise = []
    for i, b in enumerate(fr(payload)):
        bytewise += client.feed(bytes([b]))
    assert bytewise == decoded and len(decoded) == 1


JSON_RESPONSES: list[tuple[e.Response, dict]] = [
    (e.ProduceResponse(42, 2), {"type": "ProduceResponse", "base_offset": 42, "record_count": 2}),
    (e.FetchResponse((e.FetchedRecord(b'{"user":"alice"}', 100, 1641024000000000),), 101),
     {"type": "FetchResponse", "records": [{"offset": 100, "timestamp": 1641024000000000, "payload": "eyJ1c2VyIjoiYWxpY2UifQ=="}], "next_offset": 101}),
    (e.OffsetCommitResponse(False), {"type": "OffsetCommitResponse", "success": False}),
    (e.OffsetFetchResponse(None), {"type": "OffsetFetchResponse", "offset": None}),
    (e.CreateTopicResponse(True, 3), {"type": "CreateTopicResponse", "success": True, "partitions_created": 3}),
    (e.ListTopicsResponse((e.TopicInfo("a", 1),)), {"type": "ListTopicsResponse", "topics": [{"name": "a", "partition_count": 1}]}),
    (e.DescribeTopicResponse("t", (e.PartitionInfo(0, 10, 2, 3),)),
     {"type": "DescribeTopicResponse", "topic": "t", "partitions": [{"partition": 0, "high_watermark": 10, "log_start_offset": 2, "segment_count": 3}]}),
    (e.DescribePartitionResponse("t", e.PartitionInfo(1, 10, 2, 3)),
     {"type": "DescribePartitionResponse", "topic": "t", "partition": 1, "high_watermark": 10, "log_start_offset": 2, "segment_count": 3}),
    (e.MetricsResponse({"records_in_total": 5}, "ignored"), {"type": "MetricsFetchResponse", "records_in_total": 5}),
    (e.Pong(), {"type": "Pong"}),
    (e.Error(e.ErrorKind.OFFSET_OUT_OF_RANGE, "Offset 5000 out of range", {"high_watermark": 1250}),
     {"type": "Error", "code": 416, "message": "Offset 5000 out of range", "details": {"high_watermark": 1250}}),
]


@pytest.mark.parametrize("response,obj", JSON_RESPONSES, ids=lambda v: type(v).__name__ if not isinstance(v, dict) else None)
def test_json_responses(response: e.Response, obj: dict) -> None:
    server = e.RustlogServer()
    server.feed(fr(b'{"type":"Ping"}'))
    data = server.send(response)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    assert json.loads(data[4:]) == obj
    assert len(e.RustlogClient().feed(data)) == 1


def test_answers_follow_the_dialect_of_each_request_in_order() -> None:
    server = e.RustlogServer()
    events = server.feed(fr(b'{"type":"Ping"}') + fr(b"\xff") + fr(b'{"type":"Ping"}'))
    assert [ev.dialect for ev in events] == [J, B, J]
    assert server.send(e.Pong()) == fr(b'{"type":"Pong"}')
    assert server.send(e.Pong()) == fr(b"\xff")
    assert server.send(e.Pong()) == fr(b'{"type":"Pong"}')
    with pytest.raises(LocalProtocolError):
        server.send(e.Pong())


def test_error_codes_per_dialect() -> None:
    assert {k.json_code for k in e.ErrorKind} >= {400, 404, 405, 413, 416, 500, 503, 507}
    assert {k.binary_code for k in e.ErrorKind} >= {1, 2, 4, 5, 10, 11, 12, 13, 14, 500}


# ---------------------------------------------------------------- bad input that keeps the connection


@pytest.mark.parametrize("payload,kind", [
    (b'{"type":"Nope"}', e.ErrorKind.INVALID_REQUEST),
    (b'{"no_type":1}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"t","partition":0}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"t","partition":true,"records":[]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"t","partition":4294967296,"records":[]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"t","partition":0,"records":["@@@"]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"t","partition":0,"records":[1]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"","partition":0,"records":[]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Produce","topic":"a/b","partition":0,"records":[]}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"Fetch","topic":"t","partition":0,"offset":-1}', e.ErrorKind.INVALID_REQUEST),
    (b'{"type":"CreateTopic","topic":"t","partition_count":1.5}', e.ErrorKind.INVALID_REQUEST),
    (b"\x00", e.ErrorKind.INVALID_REQUEST),
    (b"\x0a", e.ErrorKind.INVALID_REQUEST),
    (b"\x07\x00\x05ab", e.ErrorKind.INVALID_REQUEST),
    (b"\x07\x00\x02\xc3\x28", e.ErrorKind.INVALID_REQUEST),
    (b"\x06extra", e.ErrorKind.INVALID_REQUEST),
    (b"\x01" + s("t") + b"\x00\x00\x00\x00\x00\x00\x03\xe9", e.ErrorKind.INVALID_REQUEST),
    (b"\x01" + s("t") + b"\x00\x00\x00\x00\x00\x00\x00\x01" + struct.pack(">I", e.MAX_RECORD_SIZE + 1), e.ErrorKind.RECORD_TOO_LARGE),
    (b"\x01" + s("t") + b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09abc", e.ErrorKind.INVALID_REQUEST),
])
def test_bad_requests_become_events_and_the_connection_goes_on(payload: bytes, kind: e.ErrorKind) -> None:
    server = e.RustlogServer()
    events = server.feed(fr(payload) + fr(b"\xff"))
    assert len(events) == 2
    bad, ping = events
    assert isinstance(bad, e.BadRequest) and bad.kind is kind and bad.message
    assert bad.dialect is (J if payload[:1] == b"{" else B)
    assert ping == e.Ping(B)


def test_too_many_json_records_and_too_large_records() -> None:
    many = json.dumps({"type": "Produce", "topic": "t", "partition": 0, "records": ["QQ=="] * 1001}).encode()
    [bad] = e.RustlogServer().feed(fr(many))
    assert isinstance(bad, e.BadRequest) and "1001" in bad.message
    big = e.RustlogClient().send(e.Produce("t", 0, (b"x" * (e.MAX_RECORD_SIZE + 1),), J))
    [bad] = e.RustlogServer(max_frame=len(big)).feed(big)
    assert isinstance(bad, e.BadRequest) and bad.kind is e.ErrorKind.RECORD_TOO_LARGE
    assert e.Error(bad.kind, "").kind.json_code == 413
    ok = [b"y" * 10] * 1000
    [good] = e.RustlogServer().feed(e.RustlogClient().send(e.Produce("t", 0, tuple(ok), B)))
    assert good == e.Produce("t", 0, tuple(ok), B)


# ---------------------------------------------------------------- fatal errors


def test_oversized_frame_is_refused_from_the_header_alone() -> None:
    server = e.RustlogServer()
    with pytest.raises(FrameTooLarge):
        server.feed(struct.pack(">I", e.MAX_FRAME_SIZE + 1))
    reply = server.fatal_reply(FrameTooLarge("x"))
    assert reply[4:5] == b"\xfe" and struct.unpack(">H", reply[5:7])[0] == 1
    # Exactly the maximum is fine (only the header is fed: nothing is allocated for it yet).
    assert e.RustlogServer().feed(struct.pack(">I", e.MAX_FRAME_SIZE)) == []
    small = e.RustlogServer(max_frame=100)
    with pytest.raises(FrameTooLarge):
        small.feed(struct.pack(">I", 101) + b"{")
    reply = small.fatal_reply(FrameTooLarge("x"))
    assert json.loads(reply[4:])["code"] == 413


def test_zero_length_frame_closes() -> None:
    with pytest.raises(e.EmptyFrame):
        e.RustlogServer().feed(b"\x00\x00\x00\x00")


@pytest.mark.parametrize("payload,error", [
    (b'{"type":"Ping"', e.MalformedJson),
    (b"{]", e.MalformedJson),
    (b'{"a":1}{"b":2}', e.MalformedJson),
    (b'{"type":"Ping","x":"\xff"}', e.InvalidUtf8),
    (b'{"type":"\xed\xa0\x80"}', e.InvalidUtf8),
])
def test_malformed_json_and_invalid_utf8_are_fatal(payload: bytes, error: type[Exception]) -> None:
    server = e.RustlogServer()
    with pytest.raises(error):
        server.feed(fr(payload))
    err = error("x")
    reply = json.loads(server.fatal_reply(err)[4:])
    assert reply["type"] == "Error" and reply["code"] == 400


def test_good_requests_before_a_fatal_frame_are_still_served() -> None:
    server = e.RustlogServer()
    events = server.feed(fr(b"\xff") + fr(b'{"type":"Ping"}') + b"\x00\x00\x00\x00")
    assert events == [e.Ping(B), e.Ping(J)]
    server.send(e.Pong())
    server.send(e.Pong())
    with pytest.raises(e.EmptyFrame):
        server.feed(b"")
    with pytest.raises(e.EmptyFrame):
        server.feed(fr(b"\xff"))


def test_client_rejects_bad_responses() -> None:
    for payload in (b"\x42", b"\x01\x00", b'{"type":"Weird"}', b'{"type":"ProduceResponse"}', b"\xfe\x00"):
        with pytest.raises(RemoteProtocolError):
            e.RustlogClient().feed(fr(payload))
    with pytest.raises(LocalProtocolError):
        e.RustlogClient().send("not a request")  # type: ignore[arg-type]


def test_render_prometheus() -> None:
    text = e.render_prometheus([e.Metric("a_total", "counter", "A things", 3), e.Metric("lat", "gauge", "L", 0.5)])
    assert text == "# HELP rustlog_a_total A things\n# TYPE rustlog_a_total counter\nrustlog_a_total 3\n" \
                   "# HELP rustlog_lat L\n# TYPE rustlog_lat gauge\nrustlog_lat 0.5\n"


# ---------------------------------------------------------------- properties


def _feed_all(conn: e.RustlogServer | e.RustlogClient, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            conn.feed(chunk)
        conn.feed(b"")
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_give_events_or_protocol_errors(chunks: list[bytes]) -> None:
    _feed_all(e.RustlogServer(max_frame=1 << 16), chunks)
    _feed_all(e.RustlogClient(max_frame=1 << 16), chunks)


_payloads = st.one_of(
    st.binary(min_size=1, max_size=80),
    st.binary(max_size=80).map(lambda b: b"{" + b),
    st.sampled_from([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0xFF, 0xFE]).flatmap(
        lambda t: st.binary(max_size=60).map(lambda b: bytes([t]) + b)),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
            ["type", "topic", "partition", "records", "offset", "group", "group_id", "max_bytes", "partition_count"]), inner, max_size=5),
        max_leaves=10,
    ).map(lambda v: json.dumps({"type": "Produce", "v": v} if not isinstance(v, dict) else v).encode()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_payloads, min_size=1, max_size=5))
def test_arbitrary_frames_give_events_or_protocol_errors(payloads: list[bytes]) -> None:
    data = b"".join(fr(p) for p in payloads)
    server = e.RustlogServer()
    try:
        events = server.feed(data)
        for ev in events:
            assert isinstance(ev, (e.BadRequest, *e.Request.__args__))
            server.send(e.Error(ev.kind, ev.message) if isinstance(ev, e.BadRequest) else e.Pong())
        server.feed(b"")
    except ProtocolError:
        pass
    _feed_all(e.RustlogClient(), [data])
