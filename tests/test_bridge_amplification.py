"""Amplification, engine by engine: a tiny input must never become unbounded output.

Compressed protocols (Lumberjack C frames, Courier JDAT/EVNT) are where a few bytes can
claim millions of events; the uncompressed ones (segment, rustlog) need at least a
header per event. Each test feeds the worst small input we know for its engine and
checks what came out, and how much memory decoding it took.
"""

from __future__ import annotations

import struct
import tracemalloc
import uuid
import zlib

import pytest

from bridges.courier.engine import CourierServer
from bridges.courier.messages import EventReceived, PayloadEnded
from bridges.courier.wire import CourierProtocolError, encode_records
from bridges.lumberjack.engine import LumberjackServer, encode_json_frame
from bridges.rustlog import engine as rl
from bridges.segment import engine as seg
from logjam.errors import DecompressedTooLarge, RemoteProtocolError

NONCE = bytes(range(16))


def deflate_stream(block: bytes, repeat: int) -> bytes:
    c = zlib.compressobj(9)
    return b"".join(c.compress(block) for _ in range(repeat)) + c.flush()


def courier_events(server: CourierServer, wire: bytes) -> tuple[int, RemoteProtocolError | None]:
    count = 0
    try:
        events = server.feed(wire)
        while events:  # the engine contract: feed(b"") until nothing comes, or the held error
            count += sum(isinstance(ev, EventReceived) for ev in events)
            events = server.feed(b"")
    except RemoteProtocolError as e:
        return count, e
    return count, None


# ------------------------------------------------------------------------------ Courier


@pytest.mark.parametrize("kind", ["JDAT", "EVNT"])
def test_courier_zeros_are_bounded_by_the_payload_event_limit_not_millions_of_events(kind: str) -> None:
    # The bomb of issue 17: 64 MiB of zeros, each 4 zero bytes a zero-length record. Such a
    # record is an event (Courier servers make an `_unmarshal_failure` of it), so the bomb is
    # stopped where a payload of `{}` records is: at --max-payload-events.
    body = deflate_stream(bytes(1 << 20), 64)
    assert len(body) < 100_000
    length = 16 + len(body) if kind == "JDAT" else 0xFFFFFFFF
    count, err = courier_events(CourierServer(max_events=1000), kind.encode() + struct.pack(">I", length) + NONCE + body)
    assert count == 1000
    assert isinstance(err, CourierProtocolError) and err.reason == "too_many_events"


def test_courier_zero_length_record_is_an_event() -> None:
    data = zlib.compress(encode_records([b'{"a":1}', b'{"a":2}']) + struct.pack(">I", 0))
    server = CourierServer()
    events = server.feed(b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data)
    bodies = [ev.body for ev in events if isinstance(ev, EventReceived)]
    assert bodies == [{"a": 1}, {"a": 2}, {"message": "", "tags": ["_unmarshal_failure"]}]
    assert isinstance(events[-1], PayloadEnded) and events[-1].count == 3


def test_courier_events_per_payload_are_limited_before_they_are_yielded() -> None:
    # 1,000 tiny valid events from a few hundred bytes: the limit stops at 100, and the
    # 101st is never handed to the bridge.
    data = deflate_stream(encode_records([b"{}"]), 1000)
    count, err = courier_events(CourierServer(max_events=100), b"EVNT\xff\xff\xff\xff" + NONCE + data)
    assert count == 100
    assert isinstance(err, CourierProtocolError) and err.reason == "too_many_events"


def test_courier_payload_at_the_event_limit_is_fine() -> None:
    data = zlib.compress(encode_records([b"{}"] * 100))
    count, err = courier_events(CourierServer(max_events=100), b"JDAT" + struct.pack(">I", 16 + len(data)) + NONCE + data)
    assert (count, err) == (100, None)


# ------------------------------------------------------------------------------ Lumberjack


def c_frame_of(body: bytes) -> bytes:
    return b"2C" + struct.pack(">I", len(body)) + body


def traced_peak(fn) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            fn()
            err = None
        except RemoteProtocolError as e:
            err = e
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return err, peak


def test_lumberjack_zero_bomb_is_refused_after_one_inflate_step() -> None:
    # 1 MiB of compressed zeros that inflates to 1 GiB: not Lumberjack, refused after the
    # first 1 MiB step instead of after inflating to the 64 MiB limit (twice, to join it).
    frame = c_frame_of(deflate_stream(bytes(1 << 20), 1024))
    server = LumberjackServer()
    err, peak = traced_peak(lambda: server.feed(frame))
    assert err is not None and err.reason == "bad_compressed_payload"
    assert peak < len(frame) * 3 + (2 << 20), f"peak {peak >> 20} MiB"


def test_lumberjack_valid_frame_bomb_stops_at_the_limit_and_keeps_nothing() -> None:
    # Valid J frames inflating past the limit: refused, holding at most the limit while
    # inflating (never the limit twice), and nothing once refused: the stored error keeps
    # no traceback, whose frames would keep the inflated steps alive.
    limit = 16 << 20
    frame = c_frame_of(deflate_stream(encode_json_frame(1, b"{}") * 65536, 40))
    server = LumberjackServer(max_decompressed_size=limit)
    err, peak = traced_peak(lambda: server.feed(frame))
    assert isinstance(err, DecompressedTooLarge)
    assert peak < limit + (4 << 20), f"peak {peak >> 20} MiB"
    tb, frames = err.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "_inflate" not in frames and "_parse" not in frames, frames
    assert server._error is err and not server.mid_frame


def test_lumberjack_c_frame_is_all_or_nothing() -> None:
    # Nothing of a C frame that breaks the limit comes out: its events are not published.
    good = encode_json_frame(1, b'{"a":1}') * 10
    frame = c_frame_of(zlib.compress(good + encode_json_frame(2, b" " * (2 << 20))))
    server = LumberjackServer(max_decompressed_size=1 << 20)
    with pytest.raises(DecompressedTooLarge):
        server.feed(frame)


def test_lumberjack_inflated_total_counts_c_frames() -> None:
    inner = encode_json_frame(1, b'{"a":1}') * 3
    server = LumberjackServer()
    server.feed(c_frame_of(zlib.compress(inner)) + encode_json_frame(4, b"{}"))
    assert server.inflated_total == len(inner)


# ------------------------------------------------------------------------------ uncompressed engines


def test_segment_needs_a_header_per_event() -> None:
    writer = uuid.uuid4()
    client = seg.SegmentClient()
    wire = client.send(seg.SetupAppend(1, writer, "scope/stream/0.#epoch.0", "")) + client.append(writer, [b""] * 1000, 1000)
    server = seg.SegmentServer()
    events = sum(len(r.payloads) for r in server.feed(wire) if isinstance(r, seg.Append))
    assert events == 1000
    assert events <= len(wire) // 8  # an EVENT header is 8 bytes: output grows with input, no faster


def test_rustlog_batches_are_bounded_and_need_bytes_per_record() -> None:
    client = rl.RustlogClient()
    wire = client.send(rl.Produce("t", 0, (b"",) * rl.MAX_RECORDS_PER_BATCH, rl.Dialect.BINARY))
    events = rl.RustlogServer().feed(wire)
    assert len(events) == 1 and len(events[0].records) == rl.MAX_RECORDS_PER_BATCH
    assert rl.MAX_RECORDS_PER_BATCH <= len(wire) // 4
    over = client.send(rl.Produce("t", 0, (b"",) * (rl.MAX_RECORDS_PER_BATCH + 1), rl.Dialect.BINARY))
    assert isinstance(rl.RustlogServer().feed(over)[0], rl.BadRequest)


def test_rustlog_create_topic_cannot_multiply_partitions_without_bound(tmp_path) -> None:
    # Each CreateTopic is a few bytes and makes up to 1,000 partitions on disk: the total is capped.
    from bridges.rustlog.log import BadPartitionCount, Log, LogConfig

    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20, fsync="never", max_total_partitions=25))
    log.create_topic("a", 10)
    log.create_topic("b", 15)
    with pytest.raises(BadPartitionCount, match="max-total-partitions"):
        log.create_topic("c", 1)
    assert log.topics() == {"a": 10, "b": 15}
