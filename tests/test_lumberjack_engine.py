"""The sans-IO Lumberjack engine: vectors (whole, byte by byte, with trailing data), limits,
acks and keepalives, real clients' framings (built with the clients' own encoders), and a
Hypothesis property that arbitrary bytes give events or a ProtocolError and nothing else."""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.lumberjack.engine import (
    V1,
    V2,
    Ack,
    AckFrame,
    DataFrame,
    JsonFrames,
    Keepalive,
    LumberjackClient,
    LumberjackServer,
    WindowFrame,
    encode_compressed,
    encode_data_frame,
    encode_json_frame,
    encode_window,
)
from logjam.errors import DecompressedTooLarge, FrameTooLarge, LocalProtocolError, ProtocolError, RemoteProtocolError

# Native-sensitive (LOGJAM_NATIVE picks the C path or its Python twin): every test whose input holds a v2 J
# frame (what the scanner of bridges/lumberjack/scan.py reads) runs with the C scanner and the Python one
# ("native": c-scan, py-scan); v1 data frames, windows, acks and the encoders never reach a scanner.
pytestmark = pytest.mark.native


@dataclass(frozen=True, slots=True)
class JsonFrame:
    """One v2 `J` frame of a run, as the vectors spell it."""

    version: int
    seq: int
    window: int
    payload: bytes


def spelled(run: JsonFrames) -> list[JsonFrame]:
    return [JsonFrame(run.version, seq, run.window, run.payload(i)) for i, seq in enumerate(run.seqs)]


def flat(events: list) -> list:
    """The events with each run of J frames (`JsonFrames`) spelled out frame by frame."""
    out: list = []
    for e in events:
        out += spelled(e) if isinstance(e, JsonFrames) else [e]
    return out


def c_frame(inner: bytes, version: bytes = b"2") -> bytes:
    body = zlib.compress(inner)
    return version + b"C" + struct.pack(">I", len(body)) + body


W3 = b"2W\x00\x00\x00\x03"
J1 = b"2J\x00\x00\x00\x01\x00\x00\x00\x0d" + b'{"message":1}'
D1 = b"1D\x00\x00\x00\x07\x00\x00\x00\x02" + b"\x00\x00\x00\x04line\x00\x00\x00\x02hi" + b"\x00\x00\x00\x04host\x00\x00\x00\x01h"

VECTORS: list[tuple[str, bytes, list]] = [
    ("window", W3, [WindowFrame(V2, 3, 1)]),
    ("empty window", b"2W\x00\x00\x00\x00", [WindowFrame(V2, 0, 1)]),
    ("huge window", b"1W\xff\xff\xff\xff", [WindowFrame(V1, 2**32 - 1, 1)]),
    ("json", J1, [JsonFrame(V2, 1, 0, b'{"message":1}')]),
    ("empty json", b"2J\x00\x00\x00\x05\x00\x00\x00\x00", [JsonFrame(V2, 5, 0, b"")]),
    ("v1 data", D1, [DataFrame(V1, 7, 0, {"line": "hi", "host": "h"})]),
    ("v1 no pairs", b"1D\x00\x00\x00\x02\x00\x00\x00\x00", [DataFrame(V1, 2, 0, {})]),
    ("v1 not utf-8 value", b"1D\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01k\x00\x00\x00\x01\xff",
     [DataFrame(V1, 1, 0, {"k": b"\xff"})]),
    ("window then json", W3 + J1, [WindowFrame(V2, 3, 1), JsonFrame(V2, 1, 1, b'{"message":1}')]),
    ("compressed json", W3 + c_frame(J1 + J1), [WindowFrame(V2, 3, 1), JsonFrame(V2, 1, 1, b'{"message":1}'),
                                                JsonFrame(V2, 1, 1, b'{"message":1}')]),
    ("window inside compressed", c_frame(W3 + J1), [WindowFrame(V2, 3, 1), JsonFrame(V2, 1, 1, b'{"message":1}')]),
    ("v1 compressed data", c_frame(b"1W\x00\x00\x00\x01" + D1, b"1"), [WindowFrame(V1, 1, 1),
                                                                    DataFrame(V1, 7, 1, {"line": "hi", "host": "h"})]),
    ("nested compressed", c_frame(c_frame(J1)), [JsonFrame(V2, 1, 0, b'{"message":1}')]),
    ("empty compressed", c_frame(b""), []),
    ("two windows", W3 + J1 + W3 + J1, [WindowFrame(V2, 3, 1), JsonFrame(V2, 1, 1, b'{"message":1}'),
                                        WindowFrame(V2, 3, 2), JsonFrame(V2, 1, 2, b'{"message":1}')]),
]

# Each is a proper prefix of a frame: it must be held back, not misparsed.
TRAILERS = [b"2", b"2W\x00", b"2J\x00\x00\x00\x09\x00\x00\x00\x05{", b"1D\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x01k",
            W3[:5], c_frame(J1)[:-1]]


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@pytest.mark.parametrize("name,data,expected", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_whole(name: str, data: bytes, expected: list, native: bool) -> None:
    server = LumberjackServer(native=native)
    assert flat(server.feed(data)) == expected
    assert not server.mid_frame


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@pytest.mark.parametrize("name,data,expected", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_byte_by_byte(name: str, data: bytes, expected: list, native: bool) -> None:
    server = LumberjackServer(native=native)
    events = []
    for i in range(len(data)):
        events += flat(server.feed(data[i : i + 1]))
    assert events == expected
    assert not server.mid_frame


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@pytest.mark.parametrize("trailer", TRAILERS)
@pytest.mark.parametrize("name,data,expected", VECTORS, ids=[v[0] for v in VECTORS])
def test_vector_with_trailing_data(name: str, data: bytes, expected: list, trailer: bytes, native: bool) -> None:
    server = LumberjackServer(native=native)
    assert flat(server.feed(data + trailer)) == expected
    assert server.mid_frame


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_back_to_back_json_frames_are_one_run_sharing_the_inflated_buffer(native: bool) -> None:
    frames = b"".join(encode_json_frame(seq, b'{"n":%d}' % seq) for seq in range(1, 5001))
    (window, run) = LumberjackServer(native=native).feed(W3 + encode_compressed(frames))
    assert isinstance(run, JsonFrames) and len(run) == 5000 and run.window == window.window == 1
    assert run.data == frames  # the inflated payload itself, not a copy per frame
    assert list(run.seqs) == list(range(1, 5001))
    assert run.payload(4999) == b'{"n":5000}'
    head, tail = run.split(4097)
    assert spelled(head) + spelled(tail) == spelled(run) and tail.data is run.data


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_a_run_ends_at_a_window_or_another_version(native: bool) -> None:
    j1_v1 = b"1" + J1[1:]
    events = LumberjackServer(native=native).feed(J1 + J1 + W3 + J1 + j1_v1 + J1)
    assert [type(e).__name__ for e in events] == ["JsonFrames", "WindowFrame", "JsonFrames", "JsonFrames", "JsonFrames"]
    assert [len(e) for e in events if isinstance(e, JsonFrames)] == [2, 1, 1, 1]
    assert [e.version for e in events if isinstance(e, JsonFrames)] == [V2, V2, V1, V2]


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_a_run_from_the_connection_buffer_holds_only_its_own_bytes(native: bool) -> None:
    server = LumberjackServer(native=native)
    frame = encode_json_frame(9, b'{"a":1}')
    server.feed(W3 + frame[:4])
    (run,) = server.feed(frame[4:] + J1)
    assert run.data == frame + J1 and list(run.offsets) == [10, len(frame) + 10]


_scan_input = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=30)).map(lambda t: encode_json_frame(*t)),
        st.sampled_from([W3, b"1" + J1[1:], b"2J\xff\xff\xff\xff\x00\x00\x00\x01", b"2J\x00\x00\x00\x01\x00\x00\x01\x00"]),
        st.binary(max_size=12),
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_scan_input, st.data())
def test_c_scanner_reads_exactly_what_the_python_one_reads(data: bytes, draw: st.DataObject) -> None:
    from array import array

    from bridges.lumberjack.scan import MODULE, _NativeScanner, _scan_py, scanner
    from harness.native import c_module

    c_module(MODULE)  # skips under LOGJAM_NATIVE=off; under require, a missing build fails
    native, python = scanner(native=True), scanner(native=False)
    assert isinstance(native, _NativeScanner) and python is _scan_py  # never one path against itself

    pos = draw.draw(st.integers(0, len(data)))
    end = draw.draw(st.integers(pos, len(data)))
    base = draw.draw(st.integers(0, pos))
    max_frame = draw.draw(st.sampled_from([0, 16, 4096]))
    results = []
    for scan in (native, python):
        cols = array("I"), array("I"), array("I")
        results.append((scan(data, pos, end, base, 0x32, max_frame, *cols), cols))
    assert results[0] == results[1]


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_trailing_frame_completes_later(native: bool) -> None:
    server = LumberjackServer(native=native)
    frame = encode_json_frame(9, b'{"a":1}')
    assert flat(server.feed(J1 + frame[:7])) == [JsonFrame(V2, 1, 0, b'{"message":1}')]
    assert flat(server.feed(frame[7:])) == [JsonFrame(V2, 9, 0, b'{"a":1}')]


def test_v1_data_split_inside_pairs_keeps_state() -> None:
    fields = {f"k{i}": "v" * i for i in range(50)}
    frame = encode_data_frame(3, fields)
    server = LumberjackServer()
    events = []
    for i in range(0, len(frame), 7):
        events += server.feed(frame[i : i + 7])
    assert events == [DataFrame(V1, 3, 0, fields)]


# ---------------------------------------------------------------- errors and limits


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@pytest.mark.parametrize(
    "data,reason",
    [
        (b"3W\x00\x00\x00\x01", "bad_version"),
        (b"2X\x00\x00\x00\x01", "unknown_frame_type"),
        (b"GET / HTTP/1.1\r\n", "bad_version"),
        (b"2C\x00\x00\x00\x03abc", "bad_zlib"),
        (c_frame(J1)[:6] + zlib.compress(J1)[:-4], None),  # incomplete: no error yet
        (b"2C" + struct.pack(">I", len(zlib.compress(J1)[:-2])) + zlib.compress(J1)[:-2], "bad_zlib"),
        (b"2C" + struct.pack(">I", len(zlib.compress(J1)) + 1) + zlib.compress(J1) + b"x", "bad_zlib"),
        (c_frame(J1[:-1]), "truncated_compressed_frame"),
        (c_frame(D1[:-1], b"1"), "truncated_compressed_frame"),
        (c_frame(b"2"), "truncated_compressed_frame"),
        (c_frame(c_frame(c_frame(J1))), "compressed_nesting"),
    ],
)
def test_bad_input_is_a_typed_error(data: bytes, reason: str | None, native: bool) -> None:
    server = LumberjackServer(native=native)
    if reason is None:
        assert server.feed(data) == []
        return
    with pytest.raises(RemoteProtocolError) as info:
        server.feed(data)
    assert info.value.reason == reason
    # A failed connection stays failed.
    with pytest.raises(RemoteProtocolError):
        server.feed(W3)


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@pytest.mark.parametrize(
    "header",
    [
        b"2J\x00\x00\x00\x01" + struct.pack(">I", 2**32 - 1),
        b"2C" + struct.pack(">I", 2**31),
        b"1D\x00\x00\x00\x01" + struct.pack(">I", 2**32 - 1),
        b"1D\x00\x00\x00\x01\x00\x00\x00\x01" + struct.pack(">I", 2**32 - 1),
        b"1D\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01k" + struct.pack(">I", 2**32 - 1),
    ],
)
def test_frame_size_checked_from_the_header_alone(header: bytes, native: bool) -> None:
    server = LumberjackServer(max_frame_size=1 << 20, native=native)
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge):
            server.feed(header)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_decompressed_size_is_bounded(native: bool) -> None:
    bomb = c_frame(encode_json_frame(1, b" " * (4 << 20)))
    assert len(bomb) < 10_000
    server = LumberjackServer(max_decompressed_size=1 << 20, native=native)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressedTooLarge):
            server.feed(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 << 20


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_nested_compressed_frames_share_the_decompressed_limit(native: bool) -> None:
    big = encode_json_frame(1, b" " * 600)
    nested = c_frame(c_frame(big) + c_frame(big))
    # Each inner C alone fits in 1000 bytes; together with their parent's output they do not.
    with pytest.raises(DecompressedTooLarge):
        LumberjackServer(max_decompressed_size=1000, native=native).feed(nested)
    assert len(flat(LumberjackServer(max_decompressed_size=4000, native=native).feed(nested))) == 2


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_frame_exactly_at_the_limit_is_accepted(native: bool) -> None:
    payload = b"x" * 100
    server = LumberjackServer(max_frame_size=100, native=native)
    assert flat(server.feed(encode_json_frame(1, payload))) == [JsonFrame(V2, 1, 0, payload)]
    with pytest.raises(FrameTooLarge):
        LumberjackServer(max_frame_size=99, native=native).feed(encode_json_frame(1, payload))


@pytest.mark.parametrize("limits", [{"max_frame_size": 0}, {"max_decompressed_size": 2**32}])
def test_limits_beyond_32_bit_offsets_are_refused(limits: dict) -> None:
    with pytest.raises(LocalProtocolError):
        LumberjackServer(**limits)


def test_huge_window_and_endless_data_stream_use_flat_memory() -> None:
    server = LumberjackServer()
    assert server.feed(b"1W\xff\xff\xff\xff") == [WindowFrame(V1, 2**32 - 1, 1)]
    frame = encode_data_frame(0, {"line": "x" * 100})
    tracemalloc.start()
    try:
        for i in range(20_000):
            (event,) = server.feed(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert event.window == 1
    assert peak < 256 * 1024


# ---------------------------------------------------------------- acks


def test_ack_is_six_bytes_in_the_connections_version() -> None:
    v1 = LumberjackServer()
    v1.feed(b"1W\x00\x00\x00\x02")
    assert v1.send(Ack(7, 1)) == b"1A\x00\x00\x00\x07"
    v2 = LumberjackServer()
    v2.feed(W3)
    assert v2.send(Ack(2**32 - 1, 1)) == b"2A\xff\xff\xff\xff"
    with pytest.raises(LocalProtocolError):
        v2.send(Ack(2**32, 1))


def test_connection_version_comes_from_the_outer_frame() -> None:
    server = LumberjackServer()
    server.feed(c_frame(b"2W\x00\x00\x00\x01" + D1, b"1"))
    assert server.send(Ack(7, 1)) == b"1A\x00\x00\x00\x07"


def test_keepalive_repeats_the_last_ack_of_the_same_window_only() -> None:
    server = LumberjackServer()
    server.feed(b"1W\x00\x00\x03\xe8")
    assert server.send(Keepalive(1)) == b"1A\x00\x00\x00\x00"
    server.send(Ack(500, 1))
    assert server.send(Keepalive(1)) == b"1A\x00\x00\x01\xf4"
    # A client that restarts at 1 per window must not see window 1's 500 as an ack of window 2.
    assert server.send(Keepalive(2)) == b"1A\x00\x00\x00\x00"


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_client_round_trip_with_every_numbering_scheme(native: bool) -> None:
    for kwargs, expected_last in [
        ({}, [2, 5]),  # counts across windows (pylogbeat)
        ({"restart_each_window": True}, [2, 3]),  # restarts at 1 (Filebeat)
        ({"first_seq": 0, "window_inside_compressed": True}, [1, 4]),  # starts at 0 (timbersnake)
        ({"version": V1, "compress_level": None}, [2, 5]),
    ]:
        client = LumberjackClient(**kwargs)
        server = LumberjackServer(native=native)
        lasts = []
        for batch in ([{"message": "a"}, {"message": "b"}], [{"message": str(i)} for i in range(3)]):
            events = [e for e in flat(server.feed(client.send(batch))) if not isinstance(e, WindowFrame)]
            assert len(events) == len(batch)
            assert events[-1].seq == client.last_seq
            lasts.append(events[-1].seq)
            assert client.feed(server.send(Ack(events[-1].seq, events[-1].window))) == [
                AckFrame(client.version, client.last_seq)
            ]
        assert lasts == expected_last, kwargs


# ---------------------------------------------------------------- real clients' framings


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_pylogbeat_framing(native: bool) -> None:
    import pylogbeat

    client = pylogbeat.PyLogBeatClient("127.0.0.1", 1)
    events = [{"message": f"m{i}", "@timestamp": "2024-01-01T00:00:00Z"} for i in range(3)]
    client._window_size = len(events)
    payload = client._compress_payload(client._factor_payload(events))
    window = struct.pack(">BBI", pylogbeat.PROTOCOL_VERSION, pylogbeat.FRAME_TYPE_WINDOW_SIZE, 3)
    got = flat(LumberjackServer(native=native).feed(window + payload))
    assert [type(e) for e in got] == [WindowFrame, JsonFrame, JsonFrame, JsonFrame]
    assert [e.seq for e in got[1:]] == [1, 2, 3]


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
def test_timbersnake_framing(native: bool) -> None:
    from timbersnake.client import Client

    client = Client("127.0.0.1", 1)
    buffer = client.pack_window_frame(3)
    for seq in range(5):
        buffer += client.pack_json_data_frame({"n": seq}, seq)
    got = flat(LumberjackServer(native=native).feed(client.pack_compressed_frame(buffer)))
    assert got[0] == WindowFrame(V2, 3, 1)
    assert [e.seq for e in got[1:]] == [0, 1, 2, 3, 4]


def test_stashward_framing() -> None:
    from stashward.handler import StashwardHandler

    window = struct.pack(b"!ssI", b"1", b"W", StashwardHandler.MAX_SEQUENCE_NUMBER)
    frames = b"".join(StashwardHandler.packetize(None, {"line": f"l{i}", "host": "h", "offset": i}, i) for i in range(3))
    got = flat(LumberjackServer().feed(window + frames))
    assert got[0] == WindowFrame(V1, 2**32 - 1, 1)
    assert got[1] == DataFrame(V1, 0, 1, {"line": "l0", "host": "h", "offset": "0"})


def test_encoders_match_the_wire_format() -> None:
    assert encode_window(5, V1) == b"1W\x00\x00\x00\x05"
    assert encode_json_frame(1, b"{}") == b"2J\x00\x00\x00\x01\x00\x00\x00\x02{}"
    assert encode_compressed(J1)[:2] == b"2C"


# ---------------------------------------------------------------- property


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_give_events_or_protocol_error(native: bool, chunks: list[bytes]) -> None:
    server = LumberjackServer(max_frame_size=4096, max_decompressed_size=8192, native=native)
    try:
        for chunk in chunks:
            for event in server.feed(chunk):
                assert isinstance(event, (WindowFrame, DataFrame, JsonFrames))
    except ProtocolError:
        pass


_frame = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda n: encode_window(n)),
    st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=40)).map(lambda t: encode_json_frame(*t)),
    st.tuples(st.integers(0, 2**32 - 1), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)).map(
        lambda t: encode_data_frame(*t)
    ),
)


@pytest.mark.parametrize("native", [True, False], ids=["c-scan", "py-scan"])
@settings(max_examples=200, deadline=None)
@given(st.lists(_frame, max_size=6), st.booleans(), st.integers(1, 17), st.binary(max_size=8))
def test_valid_streams_parse_the_same_however_split(native: bool, frames: list[bytes], compress: bool, step: int,
                                                    noise: bytes) -> None:
    stream = b"".join(frames)
    if compress:
        stream = encode_compressed(stream)
    whole = flat(LumberjackServer(native=native).feed(stream))
    split_server = LumberjackServer(native=native)
    split: list = []
    for i in range(0, len(stream), step):
        split += flat(split_server.feed(stream[i : i + step]))
    assert split == whole
    assert len(whole) == len(frames)
    # Whatever follows, already parsed events stand and nothing else escapes.
    try:
        split_server.feed(noise)
    except ProtocolError:
        pass
