"""The sans-IO Log Courier engine: vectors whole, byte by byte and with trailing data; limits; Hypothesis."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.courier.engine import FEED_EVENTS, CourierClient, CourierServer
from bridges.courier.messages import (
    Ack,
    AckReceived,
    EventReceived,
    Hello,
    PayloadEnded,
    PayloadStarted,
    Ping,
    Pong,
    PongReceived,
    Unknown,
    UnknownMessage,
    UnknownReceived,
    Version,
    VersionReceived,
)
from bridges.courier.wire import Handshake, encode_evnt, encode_jdat, encode_records
from logjam.errors import (
    CompressionError,
    DecompressedTooLarge,
    FrameTooLarge,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)

NONCE = bytes(range(16))
NONCE2 = bytes(range(16, 32))
EVENTS = [orjson.dumps({"message": f"line {i}", "@timestamp": "2024-05-01T12:00:00.123Z", "n": i}) for i in range(3)]


def helo(body: bytes) -> bytes:
    return b"HELO" + struct.pack(">I", len(body)) + body


def expected_payload(nonce: bytes, kind: str, events: list[bytes]) -> list:
    return [
        PayloadStarted(nonce, kind),
        *(EventReceived(nonce, i, orjson.loads(e)) for i, e in enumerate(events)),
        PayloadEnded(nonce, len(events)),
    ]


RUBY_HELO = struct.pack(">4sIII4s", b"\0\0\0\0", 2, 0, 0, b"RYLC")  # the Ruby client's 20 bytes
FULL_HELO = struct.pack(">4sIII4s12x", b"\0\0\0\0", 2, 9, 1, b"LCOR")

VECTORS: list[tuple[str, bytes, list]] = [
    ("helo-32", helo(FULL_HELO), [Hello(Handshake(b"\0\0\0\0", 2, 9, 1, b"LCOR"))]),
    ("helo-20-ruby", helo(RUBY_HELO), [Hello(Handshake(b"\0\0\0\0", 2, 0, 0, b"RYLC"))]),
    ("helo-empty", helo(b""), [Hello(Handshake())]),
    ("ping", b"PING\0\0\0\0", [Ping()]),
    ("jdat-1", encode_jdat(NONCE, EVENTS[:1]), expected_payload(NONCE, "JDAT", EVENTS[:1])),
    ("jdat-3", encode_jdat(NONCE, EVENTS), expected_payload(NONCE, "JDAT", EVENTS)),
    ("jdat-empty", encode_jdat(NONCE, []), expected_payload(NONCE, "JDAT", [])),
    ("evnt-3", encode_evnt(NONCE, EVENTS), expected_payload(NONCE, "EVNT", EVENTS)),
    ("evnt-empty", encode_evnt(NONCE, []), expected_payload(NONCE, "EVNT", [])),
    ("unknown-with-body", b"ZZZZ\0\0\0\x05hello", [UnknownMessage(b"ZZZZ", 5)]),
    ("unknown-empty", b"ACKN\0\0\0\0", [UnknownMessage(b"ACKN", 0)]),
    ("client-????-ignored", b"????\0\0\0\0", []),
    (
        "handshake-then-pipelined",
        helo(FULL_HELO) + encode_jdat(NONCE, EVENTS) + encode_evnt(NONCE2, EVENTS[:2]) + b"PING\0\0\0\0",
        [Hello(Handshake(b"\0\0\0\0", 2, 9, 1, b"LCOR"))]
        + expected_payload(NONCE, "JDAT", EVENTS)
        + expected_payload(NONCE2, "EVNT", EVENTS[:2])
        + [Ping()],
    ),
]
IDS = [v[0] for v in VECTORS]


def feed_all(server: CourierServer, chunks: list[bytes]) -> list:
    out: list = []
    for c in chunks:
        events = server.feed(c)
        # The engine contract: feed(b"") hands over the events a call held back (at most
        # FEED_EVENTS come per call), and raises an error held back behind good events.
        while events:
            out.extend(events)
            events = server.feed(b"")
    out.extend(server.feed(b""))
    return out


@pytest.mark.parametrize("name,wire,expected", VECTORS, ids=IDS)
def test_vector_whole(name: str, wire: bytes, expected: list) -> None:
    assert feed_all(CourierServer(), [wire]) == expected


@pytest.mark.parametrize("name,wire,expected", VECTORS, ids=IDS)
def test_vector_byte_by_byte(name: str, wire: bytes, expected: list) -> None:
    assert feed_all(CourierServer(), [wire[i : i + 1] for i in range(len(wire))]) == expected


@pytest.mark.parametrize("name,wire,expected", VECTORS, ids=IDS)
def test_vector_with_trailing_data(name: str, wire: bytes, expected: list) -> None:
    # A complete PING plus the first half of another header: the ping is decoded, the half waits.
    server = CourierServer()
    assert feed_all(server, [wire + b"PING\0\0\0\0" + b"JDA"]) == expected + [Ping()]
    assert feed_all(server, [b"T"]) == []


def test_handshake_replies() -> None:
    server = CourierServer()
    assert list(server.feed(helo(RUBY_HELO))) == [Hello(Handshake(b"\0\0\0\0", 2, 0, 0, b"RYLC"))]
    vers = server.send(Version())
    assert vers[:8] == b"VERS\0\0\0\x20" and len(vers) == 40
    assert vers[8] & 0x01, "VERS must announce EVNT support"
    with pytest.raises(LocalProtocolError):
        server.send(Version())  # only once


def test_legacy_client_gets_no_version() -> None:
    server = CourierServer()
    assert list(server.feed(encode_jdat(NONCE, EVENTS))) == expected_payload(NONCE, "JDAT", EVENTS)
    assert server.handshake is None  # an old client skips the handshake
    with pytest.raises(LocalProtocolError):
        server.send(Version())


def test_replies_encode() -> None:
    server = CourierServer()
    assert server.send(Pong()) == b"PONG\0\0\0\0"
    assert server.send(Unknown()) == b"????\0\0\0\0"
    assert server.send(Ack(NONCE, 1024)) == b"ACKN\0\0\0\x14" + NONCE + b"\0\0\x04\0"
    with pytest.raises(LocalProtocolError):
        server.send(Ack(b"short", 1))
    with pytest.raises(LocalProtocolError):
        server.send(Ack(NONCE, -1))


def test_client_half_round_trip() -> None:
    server, client = CourierServer(), CourierClient()
    wire = client.hello() + client.jdat(NONCE, EVENTS) + client.evnt(NONCE2, EVENTS) + client.ping()
    events = list(server.feed(wire))
    assert [type(e).__name__ for e in events].count("EventReceived") == 6
    replies = server.send(Version()) + server.send(Ack(NONCE, 2)) + server.send(Ack(NONCE, 3)) + server.send(Pong()) + server.send(Unknown())
    got = [ev for b in replies for ev in client.feed(bytes([b]))]
    assert isinstance(got[0], VersionReceived) and got[0].handshake.supports_evnt
    assert got[1:] == [AckReceived(NONCE, 2), AckReceived(NONCE, 3), PongReceived(), UnknownReceived()]


def test_client_rejects_bad_server_messages() -> None:
    with pytest.raises(RemoteProtocolError):
        CourierClient().feed(b"ACKN\0\0\0\x13" + bytes(19))
    with pytest.raises(RemoteProtocolError):
        CourierClient().feed(b"JDAT\0\0\0\0")
    with pytest.raises(RemoteProtocolError):
        CourierClient().feed(b"PONG\0\0\0\x01x")


# ------------------------------------------------------------------ bad input

def error_of(wire: bytes, **limits: int) -> ProtocolError:
    server = CourierServer(**limits)
    with pytest.raises(ProtocolError) as info:
        feed_all(server, [wire])
    # The engine stays failed: a later feed raises the same error.
    with pytest.raises(ProtocolError):
        list(server.feed(b"PING\0\0\0\0"))
    assert isinstance(info.value, RemoteProtocolError)
    return info.value


def test_ping_with_body_is_an_error() -> None:
    assert error_of(b"PING\0\0\0\x01x").reason == "ping_with_body"


def test_helo_too_long() -> None:
    assert error_of(helo(bytes(33))).reason == "bad_handshake"


def test_helo_after_data_is_an_error() -> None:
    assert error_of(b"PING\0\0\0\0" + helo(RUBY_HELO)).reason == "late_helo"


def test_oversize_jdat_fails_on_the_header_alone() -> None:
    # Only the 8-byte header is fed: the limit is checked before anything is read or allocated.
    e = error_of(b"JDAT" + struct.pack(">I", 10 * 1024 * 1024 + 1))
    assert isinstance(e, FrameTooLarge)
    assert isinstance(error_of(b"JDAT\xff\xff\xff\xfe"), FrameTooLarge)
    assert isinstance(error_of(b"ZZZZ\xff\xff\xff\xfe"), FrameTooLarge)


def test_max_message_is_configurable() -> None:
    wire = encode_jdat(NONCE, EVENTS)
    assert list(CourierServer(max_message=len(wire) - 8).feed(wire))
    assert isinstance(error_of(wire, max_message=len(wire) - 9), FrameTooLarge)


def test_short_jdat() -> None:
    assert error_of(b"JDAT\0\0\0\x0f" + bytes(15)).reason == "short_jdat"


def test_evnt_needs_stream_length() -> None:
    assert error_of(b"EVNT\0\0\0\x20" + bytes(32)).reason == "bad_evnt_length"


def test_corrupt_zlib_jdat() -> None:
    body = NONCE + b"this is not zlib data at all"
    assert isinstance(error_of(b"JDAT" + struct.pack(">I", len(body)) + body), CompressionError)


def test_corrupt_zlib_evnt() -> None:
    assert isinstance(error_of(b"EVNT\xff\xff\xff\xff" + NONCE + b"garbage-garbage"), CompressionError)


def test_corrupt_zlib_in_the_middle() -> None:
    good = zlib.compress(encode_records(EVENTS * 50))
    bad = good[:40] + bytes(b ^ 0x55 for b in good[40:80]) + good[80:]
    with pytest.raises(CompressionError):
        feed_all(CourierServer(), [b"JDAT" + struct.pack(">I", 16 + len(bad)) + NONCE + bad])


def test_truncated_jdat_zlib() -> None:
    data = zlib.compress(encode_records(EVENTS))[:-3]
    assert isinstance(error_of(b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data), CompressionError)


def test_jdat_without_zlib_data() -> None:
    assert isinstance(error_of(b"JDAT\0\0\0\x10" + NONCE), CompressionError)


def test_jdat_bytes_after_zlib_end() -> None:
    data = zlib.compress(encode_records(EVENTS)) + b"xx"
    assert error_of(b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data).reason == "jdat_trailing"


def test_record_truncated_by_stream_end() -> None:
    data = zlib.compress(encode_records(EVENTS)[:-5])
    assert error_of(b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data).reason == "truncated_record"


def test_record_length_over_limit() -> None:
    data = zlib.compress(struct.pack(">I", 1000) + bytes(10))
    e = error_of(b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data, max_event=999)
    assert isinstance(e, FrameTooLarge)


def test_decompressed_size_is_bounded_and_memory_stays_small() -> None:
    # An EVNT zlib bomb: one record claiming 9 MiB, then 64 MiB of zeros, inflating from
    # ~64 KiB. The engine must stop at its bound having held no more than a step of it.
    c = zlib.compressobj(9)
    head = c.compress(struct.pack(">I", 9 << 20))
    bomb = head + b"".join(c.compress(bytes(1 << 20)) for _ in range(64)) + c.flush()
    assert len(bomb) < 1 << 20
    server = CourierServer(max_decompressed=8 << 20)
    tracemalloc.start()
    try:
        with pytest.raises((DecompressedTooLarge, FrameTooLarge)):
            feed_all(server, [b"EVNT\xff\xff\xff\xff" + NONCE + bomb])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(bomb) + (2 << 20), f"peak {peak} bytes"


def test_inflated_total_is_bounded() -> None:
    # Many small records: each is fine, the payload as a whole is not.
    c = zlib.compressobj(9)
    rec = encode_records([b'{"m":"' + b"y" * 1000 + b'"}'])
    bomb = b"".join(c.compress(rec * 1000) for _ in range(20)) + c.flush()
    server = CourierServer(max_decompressed=4 << 20)
    # The records before the limit come out first, FEED_EVENTS at a time, then the error
    # (the engine contract: feed(b"") until it returns nothing or raises).
    events = server.feed(b"EVNT\xff\xff\xff\xff" + NONCE + bomb)
    count = 0
    with pytest.raises(DecompressedTooLarge):
        while True:
            assert len(events) <= FEED_EVENTS
            count += sum(isinstance(ev, EventReceived) for ev in events)
            events = server.feed(b"")
    assert 0 < count <= (4 << 20) // len(rec)


def test_evnt_is_streamed_not_held_whole() -> None:
    # 24 MiB of events through EVNT, fed in 64 KiB pieces: every event comes out, and the
    # engine's buffers never hold more than about one piece plus one inflate step.
    big = [orjson.dumps({"message": "x" * 2000, "i": i}) for i in range(12_000)]
    wire = encode_evnt(NONCE, big, level=1)
    server = CourierServer(max_decompressed=64 << 20)
    count, worst = 0, 0
    for i in range(0, len(wire), 65536):
        events = server.feed(wire[i : i + 65536])
        while events:  # as the adapters do: feed(b"") until the piece is used up
            for ev in events:
                if isinstance(ev, EventReceived):
                    assert ev.index == count
                    count += 1
                worst = max(worst, len(server._buf), len(server._plain))
            events = server.feed(b"")
    assert count == len(big)
    assert worst < 65536 + 256 * 1024 + 4096


@pytest.mark.parametrize(
    "raw,body",
    [
        (b"not json", {"message": "not json", "tags": ["_unmarshal_failure"]}),
        (b"[1, 2]", {"message": "[1, 2]", "tags": ["_unmarshal_failure"]}),
        (b"\xff\xfe", {"message_base64": "//4=", "tags": ["_unmarshal_failure"]}),
        (b'{"message": "ok", "tags": ["a"]}', {"message": "ok", "tags": ["a"]}),
    ],
)
def test_non_json_event(raw: bytes, body: dict) -> None:
    events = list(CourierServer().feed(encode_jdat(NONCE, [raw])))
    assert events[1] == EventReceived(NONCE, 0, body)


def test_unknown_type_keeps_connection() -> None:
    events = list(CourierServer().feed(b"XXXX\0\0\0\x03abc" + encode_jdat(NONCE, EVENTS[:1])))
    assert events[0] == UnknownMessage(b"XXXX", 3)
    assert events[1:] == expected_payload(NONCE, "JDAT", EVENTS[:1])


# ------------------------------------------------------------------ properties

@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_events_or_protocol_error(data: bytes) -> None:
    server = CourierServer(max_message=4096, max_decompressed=1 << 20)
    try:
        list(server.feed(data))
    except ProtocolError:
        pass


_PREFIXES = [b"", helo(RUBY_HELO), b"JDAT\0\0\0\x40" + NONCE, b"EVNT\xff\xff\xff\xff" + NONCE, b"EVNT\xff\xff\xff\xff" + NONCE + b"\x78\x9c"]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_PREFIXES), st.binary(max_size=300), st.integers(1, 17))
def test_arbitrary_payload_bytes_in_pieces(prefix: bytes, data: bytes, piece: int) -> None:
    server = CourierServer(max_message=4096, max_decompressed=1 << 20)
    wire = prefix + data
    try:
        for i in range(0, len(wire), piece):
            for ev in server.feed(wire[i : i + piece]):
                assert isinstance(ev, (Hello, Ping, UnknownMessage, PayloadStarted, EventReceived, PayloadEnded))
    except ProtocolError:
        pass


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20), max_size=4), max_size=20),
    st.booleans(),
    st.integers(1, 64),
)
def test_encoded_payloads_round_trip(events: list[dict], evnt: bool, piece: int) -> None:
    raw = [orjson.dumps(e) for e in events]
    wire = (encode_evnt if evnt else encode_jdat)(NONCE, raw)
    server = CourierServer()
    got = feed_all(server, [wire[i : i + piece] for i in range(0, len(wire), piece)])
    assert got == expected_payload(NONCE, "EVNT" if evnt else "JDAT", raw)


@pytest.mark.parametrize("kind", ["JDAT", "EVNT"])
def test_feed_hands_over_at_most_feed_events_and_resumes_with_later_bytes(kind: str) -> None:
    # 1000 events; the second half of the bytes arrives while the state machine is suspended
    # in the middle of the first: every event comes out once, in order, FEED_EVENTS at most per call.
    records = [orjson.dumps({"i": i}) for i in range(1000)]
    wire = encode_jdat(NONCE, records) if kind == "JDAT" else encode_evnt(NONCE, records, level=1)
    server = CourierServer()
    half = len(wire) // 2
    first = server.feed(wire[:half])
    assert 0 < len(first) <= FEED_EVENTS
    batches = [first, server.feed(wire[half:])]
    while batches[-1]:
        batches.append(server.feed(b""))
    assert all(len(b) <= FEED_EVENTS for b in batches)
    indices = [ev.index for b in batches for ev in b if isinstance(ev, EventReceived)]
    assert indices == list(range(1000))
    assert isinstance(batches[0][0], PayloadStarted) and isinstance([ev for b in batches for ev in b][-1], PayloadEnded)


def test_a_run_suspended_at_the_end_of_its_bytes_still_sees_bytes_fed_later() -> None:
    # The first piece completes exactly FEED_EVENTS events (PayloadStarted and 255 records), so
    # the state machine is suspended with nothing left of it; the second piece must not be lost.
    records = [orjson.dumps({"i": i}) for i in range(600)]
    wire = encode_jdat(NONCE, records, level=0)  # stored blocks: every byte inflates as it arrives

    def completed(prefix: int) -> int:
        server, n = CourierServer(), 0
        events = server.feed(wire[:prefix])
        while events:
            n += len(events)
            events = server.feed(b"")
        return n

    lo, hi = 0, len(wire)
    while lo < hi:  # the shortest prefix that completes FEED_EVENTS events
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if completed(mid) < FEED_EVENTS else (lo, mid)
    assert completed(lo) == FEED_EVENTS
    server = CourierServer()
    assert len(server.feed(wire[:lo])) == FEED_EVENTS
    batches = [server.feed(wire[lo:])]
    while batches[-1]:
        batches.append(server.feed(b""))
    assert [ev.index for b in batches for ev in b if isinstance(ev, EventReceived)] == list(range(255, 600))
