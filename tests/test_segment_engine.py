"""The segment (Pravega wire protocol) sans-IO engine: vectors whole, byte by byte and with
trailing data; exact layouts; both append forms; every protocol violation; a Hypothesis property."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.segment import engine as wire
from logjam.errors import FrameTooLarge, LocalProtocolError, ProtocolError, RemoteProtocolError

W1 = uuid.UUID("01234567-89ab-cdef-fedc-ba9876543210")
W2 = uuid.UUID("ffffffff-0000-1111-2222-333333333333")
SEG = "scope/stream/0.#epoch.0"


def header(code: int, n: int) -> bytes:
    return struct.pack(">ii", code, n)


def feed_whole(data: bytes, server: wire.SegmentServer | None = None) -> list:
    server = server or wire.SegmentServer()
    # The engine contract: an error held back behind good requests is raised by the next call.
    return server.feed(data) + server.feed(b"")


def feed_bytewise(data: bytes) -> list:
    server = wire.SegmentServer()
    out: list = []
    for i in range(len(data)):
        out.extend(server.feed(data[i : i + 1]))
    return out + server.feed(b"")


def feed_trailing(data: bytes) -> list:
    """The vector followed by the first bytes of another command: same events, nothing more."""
    server = wire.SegmentServer()
    out = list(server.feed(data + header(wire.KeepAlive.CODE, 4) + b"\x00\x01"))
    assert server._framer.buffered == 10
    return out


def all_ways(data: bytes) -> list:
    whole = feed_whole(data)
    assert feed_bytewise(data) == whole
    assert feed_trailing(data) == whole
    return whole


def client() -> wire.SegmentClient:
    return wire.SegmentClient()


SETUP = client().send(wire.SetupAppend(1, W1, SEG, "tok"))
PAYLOADS = [b'{"a":1}', b"plain text", b"\xff\x00\xfe", b""]

# ----------------------------------------------------------------------------- exact layouts


def test_exact_bytes_of_replies() -> None:
    s = wire.SegmentServer()
    assert s.send(wire.Hello()) == bytes.fromhex("ffffff81 00000008 00000011 00000005")
    assert s.send(wire.KeepAlive()) == bytes.fromhex("00000064 00000000")
    assert s.send(wire.AppendSetup(7, "ab", W1, wire.NULL_EVENT_NUMBER)) == (
        header(2, 8 + 4 + 16 + 8) + struct.pack(">q", 7) + b"\x00\x02ab" + W1.bytes + bytes.fromhex("8000000000000000")
    )
    assert s.send(wire.DataAppended(W1, 10, 4, 9, 1234)) == (
        header(7, 48) + W1.bytes + struct.pack(">qqqq", 10, 4, 9, 1234)
    )
    assert s.send(wire.ConditionalCheckFailed(W1, 5, 3)) == header(8, 32) + W1.bytes + struct.pack(">qq", 5, 3)
    assert s.send(wire.SegmentRead("s", 16, True, False, b"xy", 4)) == (
        header(10, 3 + 8 + 2 + 4 + 2 + 8) + b"\x00\x01s" + struct.pack(">q??i", 16, True, False, 2) + b"xy" + struct.pack(">q", 4)
    )
    assert s.send(wire.NoSuchSegment(3, "s", "", -1)) == header(53, 8 + 3 + 2 + 8) + struct.pack(">q", 3) + b"\x00\x01s\x00\x00" + struct.pack(">q", -1)
    assert s.send(wire.InvalidEventNumber(W1, 3, "", 9)) == header(55, 16 + 8 + 2 + 8) + W1.bytes + struct.pack(">q", 3) + b"\x00\x00" + struct.pack(">q", 9)
    assert s.send(wire.OperationUnsupported(3, "X", "")) == header(57, 8 + 3 + 2) + struct.pack(">q", 3) + b"\x00\x01X\x00\x00"
    assert s.send(wire.ErrorMessage(3, "s", "m", 0)) == header(61, 8 + 3 + 3 + 4) + struct.pack(">q", 3) + b"\x00\x01s\x00\x01m" + struct.pack(">i", 0)
    assert s.send(wire.WrongHost(3, "s", "h", "")) == header(50, 8 + 3 + 3 + 2) + struct.pack(">q", 3) + b"\x00\x01s\x00\x01h\x00\x00"
    assert s.send(wire.StreamSegmentInfo(1, "s", True, False, False, 5, 6, 0)) == (
        header(12, 8 + 3 + 3 + 24) + struct.pack(">q", 1) + b"\x00\x01s\x01\x00\x00" + struct.pack(">qqq", 5, 6, 0)
    )


def test_exact_bytes_of_requests() -> None:
    c = client()
    assert c.send(wire.SetupAppend(1, W1, "s", "")) == header(1, 8 + 16 + 3 + 2) + struct.pack(">q", 1) + W1.bytes + b"\x00\x01s\x00\x00"
    # The Rust client's standalone AppendBlockEnd: sizeOfWholeEvents == dataLen, data = EVENT commands.
    ev = wire.event_bytes(b"hi")
    assert ev == header(0, 2) + b"hi"
    assert c.append(W1, [b"hi"], 1, 5) == (
        header(4, 16 + 4 + 4 + len(ev) + 4 + 8 + 8) + W1.bytes + struct.pack(">ii", len(ev), len(ev)) + ev + struct.pack(">iqq", 1, 1, 5)
    )
    assert c.send(wire.ConditionalAppend(W1, 3, 100, b"x", 9)) == (
        header(5, 16 + 16 + 9 + 8) + W1.bytes + struct.pack(">qq", 3, 100) + header(0, 1) + b"x" + struct.pack(">q", 9)
    )


def test_modified_utf8() -> None:
    for text in ["", "plain", "nul\x00inside", "é", "€", "\U0001F600 beyond the BMP", "\uffff"]:
        raw = wire.encode_utf(text)
        assert wire.decode_utf(raw[2:]) == text
        assert b"\x00" not in raw[2:]
    assert wire.encode_utf("\x00") == b"\x00\x02\xc0\x80"
    assert wire.encode_utf("\U0001F600")[2:] == "\ud83d\ude00".encode("utf-8", "surrogatepass")  # CESU-8 pair
    with pytest.raises(LocalProtocolError):
        wire.encode_utf("x" * 65536)
    for bad in [b"\x00", b"\xff", b"a\xc0"]:
        with pytest.raises(RemoteProtocolError):
            wire.decode_utf(bad)


# ----------------------------------------------------------------------------- requests


def test_hello_keepalive_and_simple_requests() -> None:
    c = client()
    data = b"".join([
        c.send(wire.Hello(15, 5)),
        c.send(wire.KeepAlive()),
        c.send(wire.CreateSegment(1, SEG, 0, 0, "", 1024)),
        c.send(wire.GetStreamSegmentInfo(2, SEG, "")),
        c.send(wire.ReadSegment(SEG, 16, 100, "", 3)),
        c.send(wire.SealSegment(4, SEG, "")),
    ])
    assert all_ways(data) == [
        wire.Hello(15, 5), wire.KeepAlive(), wire.CreateSegment(1, SEG, 0, 0, "", 1024),
        wire.GetStreamSegmentInfo(2, SEG, ""), wire.ReadSegment(SEG, 16, 100, "", 3), wire.SealSegment(4, SEG, ""),
    ]
    assert not wire.Hello(4, 2).compatible() and not wire.Hello(30, 18).compatible()
    assert wire.Hello(15, 5).compatible() and wire.Hello(17, 17).compatible()


def test_optional_trailing_fields_absent_and_extra() -> None:
    # Older clients omit trailing fields; newer ones may add fields we do not know.
    read_old = header(9, 2 + len(SEG) + 8 + 4 + 2) + wire.encode_utf(SEG) + struct.pack(">qi", 0, 10) + b"\x00\x00"
    create_old = header(20, 8 + 2 + len(SEG) + 4 + 1 + 2) + struct.pack(">q", 1) + wire.encode_utf(SEG) + struct.pack(">ib", 0, 0) + b"\x00\x00"
    hello_new = header(-127, 12) + struct.pack(">iii", 17, 5, 99)
    assert all_ways(read_old + create_old + hello_new) == [
        wire.ReadSegment(SEG, 0, 10, "", -1), wire.CreateSegment(1, SEG, 0, 0, "", 0), wire.Hello(17, 5),
    ]
    ev = wire.event_bytes(b"x")
    end_old = header(4, 16 + 8 + len(ev) + 12) + W1.bytes + struct.pack(">ii", len(ev), len(ev)) + ev + struct.pack(">iq", 1, 1)
    (append,) = all_ways(SETUP + end_old)[1:]
    assert append.request_id == -1 and append.payloads == (b"x",)
    # Replies with optional fields, as a client sees them.
    c = client()
    old = header(7, 24) + W1.bytes + struct.pack(">q", 3) + header(53, 8 + 3) + struct.pack(">q", 1) + b"\x00\x01s"
    assert list(c.feed(old)) == [wire.DataAppended(W1, 3, -1, -1, -1), wire.NoSuchSegment(1, "s", "", -1)]


def test_unsupported_known_requests_carry_their_request_id() -> None:
    delete = header(30, 8 + 3 + 2) + struct.pack(">q", 42) + b"\x00\x01s\x00\x00"
    table = header(70, 4) + b"abcd"
    assert all_ways(delete + table) == [wire.Unsupported(30, "DELETE_SEGMENT", 42), wire.Unsupported(70, "CREATE_TABLE_SEGMENT", -1)]
    # ConditionalBlockEnd: UUID, i64 eventNumber, i64 expectedOffset, i32 len + data, i64 requestId.
    cbe = W1.bytes + struct.pack(">qqi", 1, 0, 3) + b"abc" + struct.pack(">q", 64)
    assert all_ways(header(89, len(cbe)) + cbe) == [wire.Unsupported(89, "CONDITIONAL_BLOCK_END", 64)]


# ----------------------------------------------------------------------------- appends


def test_standalone_append_as_the_rust_client_sends_it() -> None:
    data = SETUP + client().append(W1, PAYLOADS, 4, 7)
    setup, append = all_ways(data)
    assert setup == wire.SetupAppend(1, W1, SEG, "tok")
    assert append.writer_id == W1 and append.segment == SEG
    assert append.payloads == tuple(PAYLOADS)
    assert append.num_events == 4 and append.last_event_number == 4 and append.first_event_number == 1
    assert append.request_id == 7 and append.expected_offset is None
    assert append.data == b"".join(wire.event_bytes(p) for p in PAYLOADS)
    assert append.event_offsets == (0, 15, 33, 44)


def test_block_form_every_split_point() -> None:
    events = b"".join(wire.event_bytes(p) for p in PAYLOADS)
    c = client()
    for split in range(len(events) + 1):
        data = SETUP + c.append(W1, PAYLOADS, 10, 3, split_at=split)
        (append,) = feed_whole(data)[1:]
        assert append.data == events and append.payloads == tuple(PAYLOADS), split
    # Byte by byte and with trailing data for a split in the middle of an event header.
    (append,) = all_ways(SETUP + c.append(W1, PAYLOADS, 10, 3, split_at=18))[1:]
    assert append.payloads == tuple(PAYLOADS)


def test_block_form_with_padding_and_many_blocks() -> None:
    c = client()
    events = b"".join(wire.event_bytes(p) for p in PAYLOADS[:2])
    data = SETUP + c.append(W1, PAYLOADS[:2], 2, 1, split_at=len(events), padding=13)
    data += c.append(W1, [b"third"], 3, 2, split_at=5)
    data += c.append(W1, [b"fourth", b"fifth"], 5, 3)
    got = all_ways(data)[1:]
    assert [a.payloads for a in got] == [tuple(PAYLOADS[:2]), (b"third",), (b"fourth", b"fifth")]
    assert [a.last_event_number for a in got] == [2, 3, 5]
    # A standalone Padding between commands is skipped, as the segment store does.
    assert all_ways(client().send(wire.Padding(9)) + c.send(wire.KeepAlive())) == [wire.KeepAlive()]


def test_many_writers_on_one_connection() -> None:
    c = client()
    data = SETUP + c.send(wire.SetupAppend(2, W2, "other", ""))
    data += c.append(W1, [b"a"], 1, 3) + c.append(W2, [b"b", b"c"], 2, 4, split_at=4) + c.append(W1, [b"d"], 2, 5)
    got = all_ways(data)
    appends = [e for e in got if isinstance(e, wire.Append)]
    assert [(a.writer_id, a.segment, a.payloads) for a in appends] == [
        (W1, SEG, (b"a",)), (W2, "other", (b"b", b"c")), (W1, SEG, (b"d",)),
    ]


def test_conditional_append() -> None:
    c = client()
    (ca,) = all_ways(SETUP + c.send(wire.ConditionalAppend(W1, 5, 128, b"payload", 11)))[1:]
    assert ca.expected_offset == 128 and ca.payloads == (b"payload",) and ca.data == wire.event_bytes(b"payload")
    assert ca.num_events == 1 and ca.last_event_number == 5 and ca.request_id == 11


# ----------------------------------------------------------------------------- violations


def block_end(writer: uuid.UUID, whole: int, data: bytes, num: int, last: int) -> bytes:
    return client().send(wire.AppendBlockEnd(writer, whole, data, num, last, 1))


EV = wire.event_bytes(b"e")
BAD = {
    "unknown_command": header(6, 0),
    "bad_length": header(100, -1),
    "no_setup_append": client().append(W1, [b"x"], 1),
    "bad_event_count": SETUP + block_end(W1, len(EV), EV, 0, 1),
    "bad_event_count_mismatch": SETUP + block_end(W1, len(EV), EV, 2, 1),
    "torn_event": SETUP + block_end(W1, len(EV), EV[:-1], 1, 1),
    "bad_event": SETUP + block_end(W1, 8, header(3, 0), 1, 1),
    "block_interrupted": SETUP + client().send(wire.AppendBlock(W1, EV)) + SETUP,
    "block_interrupted_padding": SETUP + client().send(wire.AppendBlock(W1, EV)) + client().send(wire.Padding(1)),
    "stray_partial_event": SETUP + client().send(wire.PartialEvent(b"x")),
    "bad_block_size": SETUP + client().send(wire.AppendBlock(W1, EV)) + block_end(W1, len(EV) + 1, b"", 1, 1),
    "bad_block_tail_type": SETUP + client().send(wire.AppendBlock(W1, EV + header(1, 0))) + block_end(W1, len(EV), b"", 1, 1),
    "bad_block_tail_torn": SETUP + client().send(wire.AppendBlock(W1, EV + b"\xff\xff")) + block_end(W1, len(EV), b"", 1, 1),
    "bad_block_tail_overrun": SETUP + client().send(wire.AppendBlock(W1, EV + header(-2, 5))) + block_end(W1, len(EV), b"", 1, 1),
    "padding_then_data": SETUP + client().send(wire.AppendBlock(W1, EV + header(-1, 0))) + block_end(W1, len(EV), b"x", 1, 1),
    "data_without_partial": SETUP + client().send(wire.AppendBlock(W1, EV)) + block_end(W1, len(EV), EV, 2, 2),
    "writer_mismatch": SETUP + client().send(wire.SetupAppend(2, W2, SEG, "")) + client().send(wire.AppendBlock(W1, EV)) + block_end(W2, len(EV), b"", 1, 1),
    "truncated_command": header(1, 4) + b"\x00\x00\x00\x01",
    "bad_string": header(11, 8 + 3 + 2) + struct.pack(">q", 1) + b"\x00\x01\xff\x00\x00",
    "negative_data_length": SETUP + header(4, 16 + 8) + W1.bytes + struct.pack(">ii", 0, -5),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_violations_raise_typed_errors(name: str) -> None:
    for feed in (feed_whole, feed_bytewise):
        with pytest.raises(wire.SegmentProtocolError):
            feed(BAD[name])


def test_event_numbers_going_backwards() -> None:
    c = client()
    data = SETUP + c.append(W1, [b"a", b"b"], 5, 1) + c.append(W1, [b"c"], 4, 2)
    server = wire.SegmentServer()
    events = server.feed(data)  # the good requests first (the engine contract) ...
    assert [e.__class__ for e in events] == [wire.SetupAppend, wire.Append]
    assert events[1].last_event_number == 5
    with pytest.raises(wire.EventNumberWentBackwards) as info:  # ... then the error, by the next call
        server.feed(b"")
    assert (info.value.writer_id, info.value.event_number, info.value.request_id) == (W1, 4, 2)
    assert info.value.reason == "invalid_event_number"


def test_oversize_header_is_refused_before_the_body_arrives() -> None:
    server = wire.SegmentServer()
    with pytest.raises(FrameTooLarge):
        list(server.feed(header(3, wire.MAX_COMMAND_SIZE - 7)))  # one byte over 16 MiB - 1 in all
    assert len(server._framer._buf) <= 8  # nothing was allocated for the body
    # Exactly the maximum is fine (only the header is buffered while the body is missing).
    server = wire.SegmentServer()
    assert list(server.feed(header(100, wire.MAX_COMMAND_SIZE - 8))) == []
    # A smaller configured limit is honoured too.
    with pytest.raises(FrameTooLarge):
        list(wire.SegmentServer(max_command=1024).feed(header(100, 1017)))
    with pytest.raises(LocalProtocolError):
        wire.SegmentServer(max_command=wire.MAX_COMMAND_SIZE + 1)


def test_local_errors_on_send() -> None:
    s = wire.SegmentServer(max_command=64)
    with pytest.raises(LocalProtocolError):
        s.send(wire.SegmentRead("s", 0, False, False, b"x" * 100))
    with pytest.raises(LocalProtocolError):
        s.send(wire.DataAppended(W1, 2**63))
    with pytest.raises(LocalProtocolError):
        client().append(W1, [], 1)


# ----------------------------------------------------------------------------- client half


def test_client_half_parses_every_reply_byte_by_byte() -> None:
    s = wire.SegmentServer()
    replies = [
        wire.Hello(), wire.KeepAlive(), wire.AppendSetup(1, SEG, W1, wire.NULL_EVENT_NUMBER),
        wire.DataAppended(W1, 5, 2, 3, 99), wire.ConditionalCheckFailed(W1, 6, 4),
        wire.SegmentRead(SEG, 0, True, True, EV, 5), wire.StreamSegmentInfo(6, SEG, True, True, False, 1, 2, 0),
        wire.SegmentCreated(7, SEG), wire.SegmentSealed(8, SEG), wire.WrongHost(9, SEG, "", ""),
        wire.SegmentIsSealed(10, SEG, "", 4), wire.SegmentAlreadyExists(11, SEG, ""), wire.NoSuchSegment(12, SEG, "", -1),
        wire.InvalidEventNumber(W1, 13, "", 3), wire.OperationUnsupported(14, "DELETE_SEGMENT", ""),
        wire.ErrorMessage(15, SEG, "bad offset", 0),
    ]
    data = b"".join(s.send(r) for r in replies)
    assert list(client().feed(data)) == replies
    c = client()
    got = []
    for i in range(len(data)):
        got.extend(c.feed(data[i : i + 1]))
    assert got == replies
    with pytest.raises(wire.SegmentProtocolError):
        list(client().feed(client().send(wire.SetupAppend(1, W1, "s"))))  # a request is not a reply


def test_split_events_leaves_a_torn_tail() -> None:
    data = b"".join(wire.event_bytes(p) for p in PAYLOADS)
    events, used = wire.split_events(data[:-1] if PAYLOADS[-1] else data[:20], base_offset=100)
    assert events[0] == (100, PAYLOADS[0]) and used < len(data)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_give_events_or_protocol_error(data: bytes) -> None:
    for server in (wire.SegmentServer(), wire.SegmentServer(max_command=256)):
        try:
            for event in server.feed(data):
                assert isinstance(event, (wire.Hello, wire.KeepAlive, wire.SetupAppend, wire.Append, wire.ReadSegment,
                                          wire.GetStreamSegmentInfo, wire.CreateSegment, wire.SealSegment, wire.Unsupported))
        except ProtocolError:
            pass


KNOWN = sorted(wire.COMMAND_NAMES)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KNOWN), st.binary(max_size=80)), max_size=8), st.booleans())
def test_framed_garbage_with_known_types_gives_events_or_protocol_error(cmds: list[tuple[int, bytes]], setup: bool) -> None:
    # Valid headers around random bodies reach every command parser, not just the framer.
    data = (SETUP if setup else b"") + b"".join(header(code, len(body)) + body for code, body in cmds)
    for feed in (feed_whole, feed_bytewise):
        try:
            feed(data)
        except ProtocolError:
            pass
    try:
        list(client().feed(data))
    except ProtocolError:
        pass
