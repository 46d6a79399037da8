"""The segment bridge end to end: a real `logjam-device`, a real `logjam-bridge segment`
process, the Pravega-protocol test client, and a subscriber on the device.

Covers both append forms, many writers on one connection, SIGKILL mid-stream and
exactly-once resume, recovery of stored-but-unforwarded appends, reads, conditional
appends, every error reply, garbage and oversize headers, TLS and mutual TLS, the
device paused, and --app-env-field."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridges.segment import engine as wire
from bridges.segment.store import dir_name
from tests.bridge_support import (BridgeProcess, client_tls, collect, drain, read_replies, ready_subscriber,
                                  send_unless_halted, start_bridge, stop_bridge)
from harness.device import start_device
from harness.processes import free_port, start, stop, wait_for
from harness.segment_client import SegmentTestClient, ServerClosed

SEG = "mesh/logs/0.#epoch.0"


def start_segment(device_router: str, data_dir: Path, *extra: str, **kwargs: Any) -> BridgeProcess:
    """`logjam-bridge segment` storing under `data_dir`, with KeepAlives every 0.5 s so a paused device shows soon."""
    return start_bridge("segment", device_router, "--keepalive-interval", "0.5", *extra, data_dir=data_dir, **kwargs)


@pytest.fixture
def bridge(device, tmp_path):
    b = start_segment(device.router, tmp_path / "data")
    yield b
    stop_bridge(b)


def writer_ready(c: SegmentTestClient, segment: str = SEG, writer: uuid.UUID | None = None) -> uuid.UUID:
    writer = writer or uuid.uuid4()
    reply = c.create_segment(segment)
    assert isinstance(reply, (wire.SegmentCreated, wire.SegmentAlreadyExists)), reply
    setup = c.setup_append(writer, segment)
    assert isinstance(setup, wire.AppendSetup) and setup.last_event_number == wire.NULL_EVENT_NUMBER, setup
    return writer


def js(**fields: Any) -> bytes:
    return orjson.dumps(fields)


# ---------------------------------------------------------------- forms and mapping


@pytest.mark.timeout(60)
def test_simple_and_batched_forms_arrive_once_with_body_and_metadata(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    with SegmentTestClient(bridge.port) as c:
        assert c.hello(15, 5) == wire.Hello(17, 5)
        w = writer_ready(c)
        first = [js(n=1, kind="json", **{"@timestamp": "2024-05-01T10:00:00Z"}), b"plain 2", b"\xff\xfe 3", js(n=4), b"[5]"]
        second = [js(n=i) for i in range(6, 11)]
        third = [js(n=11), js(n=12), b"13"]
        fourth = [b"x" * 300 + b"14", js(n=15)]
        c.append(w, first, 5)  # standalone AppendBlockEnd (the Rust client's form)
        c.append(w, second, 10, split_at=40)  # block + PartialEvent + rest in AppendBlockEnd
        sizes = sum(len(wire.event_bytes(p)) for p in third)
        c.append(w, third, 13, split_at=sizes, padding=24)  # block + Padding
        c.append(w, fourth, 15, split_at=5)  # split inside the first EVENT header
        acks = [c.expect(wire.DataAppended) for _ in range(4)]
        assert [a.event_number for a in acks] == [5, 10, 13, 15]
        assert [a.previous_event_number for a in acks] == [wire.NULL_EVENT_NUMBER, 5, 10, 13]
        assert [a.request_id for a in acks] == [3, 4, 5, 6]
        payloads = first + second + third + fourth
        total = sum(len(wire.event_bytes(p)) for p in payloads)
        assert acks[-1].current_segment_write_offset == total
        assert c.read_all(SEG) == payloads
        info = c.info(SEG)
        assert isinstance(info, wire.StreamSegmentInfo) and info.exists and info.write_offset == total and not info.is_sealed
    got = collect(sub, bridge.app_env, 15)
    assert drain(sub, bridge.app_env, 0.5) == []
    bodies = [b for _, b in got]
    by_number = {b["@metadata"]["event_number"]: b for b in bodies}
    assert sorted(by_number) == list(range(1, 16))
    assert by_number[1]["n"] == 1 and by_number[1]["kind"] == "json"
    assert by_number[2]["message"] == "plain 2"
    assert by_number[3]["message_base64"] == "//4gMw=="
    assert by_number[5]["message"] == "[5]"  # JSON, but not an object
    assert by_number[13]["message"] == "13"
    meta = by_number[7]["@metadata"]
    assert meta["protocol"] == "segment" and meta["protocol_version"] == "15" and meta["segment"] == SEG
    assert meta["writer_id"] == str(w) and meta["peer"].startswith("127.0.0.1:") and "tls" not in meta
    offsets = [b["@metadata"]["segment_offset"] for b in sorted(bodies, key=lambda b: b["@metadata"]["event_number"])]
    assert offsets == [sum(len(wire.event_bytes(p)) for p in payloads[:i]) for i in range(15)]
    msg1 = next(m for m, b in got if b["@metadata"]["event_number"] == 1)
    assert msg1.meta.created_ms == 1714557600000 and msg1.topic == "logs.segment"
    sub.close()


@pytest.mark.timeout(60)
def test_many_writers_on_one_connection(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    segments = [SEG, "mesh/logs/1.#epoch.0"]
    with SegmentTestClient(bridge.port) as c:
        c.hello()
        for s in segments:
            assert isinstance(c.create_segment(s), wire.SegmentCreated)
        writers = [uuid.uuid4() for _ in range(6)]
        for i, w in enumerate(writers):
            assert isinstance(c.setup_append(w, segments[i % 2]), wire.AppendSetup)
        rounds = 10
        for r in range(rounds):  # interleaved and pipelined: no waiting for acks
            for i, w in enumerate(writers):
                c.append(w, [js(w=i, r=r, k=k) for k in range(3)], (r + 1) * 3, split_at=(7 if r % 2 else None))
        acks = [c.expect(wire.DataAppended) for _ in range(rounds * len(writers))]
        for w in writers:
            mine = [a for a in acks if a.writer_id == w]
            assert [a.event_number for a in mine] == [(r + 1) * 3 for r in range(rounds)]
            assert [a.previous_event_number for a in mine] == [wire.NULL_EVENT_NUMBER] + [(r + 1) * 3 for r in range(rounds - 1)]
        assert len(c.read_all(segments[0])) == len(c.read_all(segments[1])) == 3 * 3 * rounds
    got = collect(sub, bridge.app_env, rounds * len(writers) * 3)
    keys = {(b["w"], b["r"], b["k"]) for _, b in got}
    assert len(keys) == len(got) == rounds * len(writers) * 3
    for _, b in got:
        assert b["@metadata"]["segment"] == segments[b["w"] % 2]
        assert b["@metadata"]["event_number"] == b["r"] * 3 + b["k"] + 1
    sub.close()


# ---------------------------------------------------------------- crashes and resume


def _segment_events(port: int, segment: str = SEG) -> list[int]:
    with SegmentTestClient(port) as c:
        c.hello()
        return [orjson.loads(p)["n"] for p in c.read_all(segment)]


@pytest.mark.timeout(120)
def test_sigkill_mid_stream_then_resume_without_duplicates_or_loss(device, tmp_path) -> None:
    b = start_segment(device.router, tmp_path / "data")
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    batch, total = 20, 6000
    acked: list[int] = []
    sent_upto = 0

    def stream(c: SegmentTestClient, w: uuid.UUID, start_after: int) -> None:
        """Pipelined appends with up to 8 outstanding, until done or the bridge dies."""
        nonlocal sent_upto
        n = start_after
        outstanding = 0
        try:
            while n < total or outstanding:
                while n < total and outstanding < 8:
                    nums = range(n + 1, min(n + batch, total) + 1)
                    c.append(w, [js(n=i, pad="p" * 150) for i in nums], nums[-1], split_at=(33 if nums[0] % 40 == 1 else None))
                    n = nums[-1]
                    sent_upto = n
                    outstanding += 1
                ack = c.expect(wire.DataAppended)
                acked.append(ack.event_number)
                outstanding -= 1
        except (ServerClosed, ConnectionError, OSError):
            pass

    w = uuid.uuid4()
    c = SegmentTestClient(b.port)
    c.hello()
    writer_ready(c, writer=w)
    t = threading.Thread(target=stream, args=(c, w, 0), daemon=True)
    t.start()
    wait_for(lambda: len(acked) >= 40, timeout=60, what="acks before the kill")
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(10)
    t.join(20)
    c.close()
    last_acked = max(acked)
    assert last_acked < total, "the kill came too late to be mid-stream"

    b2 = start_segment(device.router, b.data_dir, app_env=b.app_env, port=b.port)
    try:
        with SegmentTestClient(b2.port) as c2:
            c2.hello()
            setup = c2.setup_append(w, SEG)
            assert isinstance(setup, wire.AppendSetup)
            resume = setup.last_event_number
            assert last_acked <= resume <= sent_upto
            acked.clear()
            stream(c2, w, resume)
            assert acked and acked[-1] == total
        # The segment holds every event exactly once, in order.
        assert _segment_events(b2.port) == list(range(1, total + 1))
        # At the device: nothing missing. A copy is possible only for appends that were
        # stored but not yet acknowledged when the bridge died (see docs/protocols/segment.md).
        got = collect(sub, b.app_env, total, timeout=60)
        got += drain(sub, b.app_env, 1.0)
        numbers = [body["n"] for _, body in got]
        assert set(numbers) == set(range(1, total + 1))
        dups = {n for n in numbers if numbers.count(n) > 1} if len(numbers) != total else set()
        assert all(last_acked < n <= resume for n in dups), sorted(dups)
        print(f"kill: last_acked={last_acked} resume={resume} sent={sent_upto} duplicates at the device={len(dups)}")
        # A consumer drops such copies by their (segment, segment_offset) key: then exactly once.
        unique = {(body["@metadata"]["segment"], body["@metadata"]["segment_offset"]): body["n"] for _, body in got}
        assert sorted(unique.values()) == list(range(1, total + 1))
        for _, body in got:
            assert body["@metadata"]["event_number"] == body["n"]
    finally:
        sub.close()
        stop_bridge(b2)


@pytest.mark.timeout(120)
def test_stored_but_unforwarded_appends_are_forwarded_before_append_setup(device_factory, tmp_path) -> None:
    dev = device_factory()
    ports = {"router": dev.router_port, "pull": dev.pull_port, "pub": dev.pub_port, "stats": dev.stats_port}
    b = start_segment(dev.router, tmp_path / "data")
    w = uuid.uuid4()
    with SegmentTestClient(b.port) as c:
        c.hello()
        writer_ready(c, writer=w)
        c.append(w, [js(n=i) for i in range(1, 11)], 10)
        c.expect(wire.DataAppended)
        assert stop(dev.proc) == 0  # the device goes away
        c.append(w, [js(n=i) for i in range(11, 31)], 30, split_at=50)
        c.append(w, [js(n=i) for i in range(31, 41)], 40)
        # Stored, but the device never saw them: no ack.
        with pytest.raises(TimeoutError):
            c.expect(wire.DataAppended, timeout=1.0)
        info = c.info(SEG)
        assert info.write_offset > 0
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(10)

    dev2 = start_device(ports=ports)
    try:
        sub = ready_subscriber(dev2.pub, dev2.router, b.app_env)
        b2 = start_segment(dev2.router, b.data_dir, app_env=b.app_env)
        try:
            with SegmentTestClient(b2.port) as c:
                c.hello()
                setup = c.setup_append(w, SEG)
                assert isinstance(setup, wire.AppendSetup) and setup.last_event_number == 40
            # Everything AppendSetup implicitly acknowledged is already at the device, once.
            got = collect(sub, b.app_env, 30, timeout=30)
            got += drain(sub, b.app_env, 0.5)
            assert sorted(body["n"] for _, body in got) == list(range(11, 41))
            assert all(body["@metadata"].get("recovered") for _, body in got)
            assert _segment_events(b2.port) == list(range(1, 41))
        finally:
            sub.close()
            out = stop_bridge(b2)
        assert "not yet accepted by the device" in out
    finally:
        stop(dev2.proc)


@pytest.mark.timeout(120)
def test_sigterm_mid_stream_finishes_in_flight_appends_then_resume_is_exactly_once(device, tmp_path) -> None:
    b = start_segment(device.router, tmp_path / "data")
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    w = uuid.uuid4()
    total, batch = 4000, 25
    acked: list[int] = []
    c = SegmentTestClient(b.port)
    c.hello()
    writer_ready(c, writer=w)
    n = 0
    for _ in range(12):  # pipelined, no waiting
        c.append(w, [js(n=i) for i in range(n + 1, n + batch + 1)], n + batch)
        n += batch
    acked.append(c.expect(wire.DataAppended).event_number)
    assert stop(b.proc) == 0  # SIGTERM with appends in flight
    out = b.output()
    try:
        while True:
            reply = c.recv(5)
            if isinstance(reply, wire.DataAppended):
                acked.append(reply.event_number)
    except (ServerClosed, TimeoutError, OSError):
        pass
    c.close()
    assert "stopped" in out
    b2 = start_segment(device.router, b.data_dir, app_env=b.app_env)
    try:
        with SegmentTestClient(b2.port) as c2:
            c2.hello()
            resume = c2.setup_append(w, SEG).last_event_number
            assert max(acked) <= resume <= n
            m = resume
            while m < total:
                c2.append(w, [js(n=i) for i in range(m + 1, min(m + batch, total) + 1)], min(m + batch, total))
                m = min(m + batch, total)
                c2.expect(wire.DataAppended)
        assert _segment_events(b2.port) == list(range(1, total + 1))
        got = collect(sub, b.app_env, total, timeout=60)
        got += drain(sub, b.app_env, 0.5)
        assert sorted(body["n"] for _, body in got) == list(range(1, total + 1))  # exactly once
    finally:
        sub.close()
        out2 = stop_bridge(b2)
    assert "not yet accepted by the device" not in out2


# ---------------------------------------------------------------- reads, conditional appends, errors


@pytest.mark.timeout(60)
def test_reads_from_the_middle_at_the_tail_and_after_sealing(bridge) -> None:
    payloads = [f"event {i}".encode() for i in range(10)]
    sizes = [len(wire.event_bytes(p)) for p in payloads]
    with SegmentTestClient(bridge.port) as c:
        c.hello()
        w = writer_ready(c)
        c.append(w, payloads, 10)
        assert c.expect(wire.DataAppended).current_segment_write_offset == sum(sizes)
        middle = sum(sizes[:3])
        r = c.read(SEG, middle, 2 * sizes[3])
        assert isinstance(r, wire.SegmentRead) and r.offset == middle
        assert r.data == b"".join(wire.event_bytes(p) for p in payloads[3:5])
        assert not r.at_tail and not r.end_of_segment and r.request_id == c._next_request
        r = c.read(SEG, middle + 4, 1000)  # not on an event boundary: bytes are bytes
        assert r.data == b"".join(wire.event_bytes(p) for p in payloads)[middle + 4 :] and r.at_tail
        r = c.read(SEG, sum(sizes))
        assert r.data == b"" and r.at_tail and not r.end_of_segment
        err = c.read(SEG, sum(sizes) + 1)
        assert isinstance(err, wire.ErrorMessage) and err.error_code == 0 and err.segment == SEG
        c.send(wire.SealSegment(99, SEG, ""))
        assert c.recv() == wire.SegmentSealed(99, SEG)
        r = c.read(SEG, sum(sizes[:9]))
        assert r.data == wire.event_bytes(payloads[9]) and r.at_tail and r.end_of_segment
        info = c.info(SEG)
        assert info.is_sealed and info.write_offset == sum(sizes)
        assert isinstance(c.setup_append(uuid.uuid4(), SEG), wire.SegmentIsSealed)
        c.append(w, [b"late"], 11)
        assert isinstance(c.recv(), wire.SegmentIsSealed)


@pytest.mark.timeout(60)
def test_conditional_append(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    with SegmentTestClient(bridge.port) as c:
        c.hello()
        w = writer_ready(c)
        c.send(wire.ConditionalAppend(w, 1, 0, js(n=1), 50))
        ack = c.expect(wire.DataAppended)
        assert (ack.event_number, ack.request_id) == (1, 50)
        end = ack.current_segment_write_offset
        c.send(wire.ConditionalAppend(w, 2, 0, js(n=2), 51))  # stale offset
        assert c.recv() == wire.ConditionalCheckFailed(w, 2, 51)
        c.send(wire.ConditionalAppend(w, 2, end, js(n=2), 52))  # the connection is still good
        ack = c.expect(wire.DataAppended)
        assert (ack.event_number, ack.previous_event_number, ack.request_id) == (2, 1, 52)
        assert [orjson.loads(p)["n"] for p in c.read_all(SEG)] == [1, 2]
    got = collect(sub, bridge.app_env, 2)
    assert drain(sub, bridge.app_env, 0.5) == []
    assert sorted(b["n"] for _, b in got) == [1, 2]
    sub.close()


@pytest.mark.timeout(60)
def test_every_error_reply(bridge) -> None:
    with SegmentTestClient(bridge.port) as c:
        c.hello()
        c.send(wire.KeepAlive())
        assert c.recv() == wire.KeepAlive()
        assert c.setup_append(uuid.uuid4(), "nope") == wire.NoSuchSegment(1, "nope", "", -1)
        assert isinstance(c.read("nope", 0), wire.NoSuchSegment)
        assert isinstance(c.info("nope"), wire.NoSuchSegment)
        assert isinstance(c.create_segment(SEG), wire.SegmentCreated)
        assert c.create_segment(SEG) == wire.SegmentAlreadyExists(c._next_request, SEG, "")
        assert isinstance(c.create_segment(""), wire.ErrorMessage)
        c.send_raw(struct.pack(">iiq", 30, 8 + 4, 77) + b"\x00\x00\x00\x00")  # DeleteSegment
        assert c.recv() == wire.OperationUnsupported(77, "DELETE_SEGMENT", "")
        err = c.read(SEG, 5)
        assert isinstance(err, wire.ErrorMessage) and err.error_code == 0
        w = uuid.uuid4()
        assert isinstance(c.setup_append(w, SEG), wire.AppendSetup)
        c.append(w, [b"a", b"b"], 2)
        c.expect(wire.DataAppended)
        # Event numbers going backwards on one connection: InvalidEventNumber, then close.
        c.append(w, [b"c"], 1, request_id=9)
        assert c.recv() == wire.InvalidEventNumber(w, 9, "", 1)
        assert c.closed_by_server()
    with SegmentTestClient(bridge.port) as c:
        # A new connection resending what the segment already holds is refused the same way.
        c.hello()
        setup = c.setup_append(w, SEG)
        assert setup.last_event_number == 2
        c.append(w, [b"b"], 2, request_id=5)
        assert c.recv() == wire.InvalidEventNumber(w, 5, "", 2)
        assert c.closed_by_server()
    with SegmentTestClient(bridge.port) as c:
        # Incompatible versions: our Hello, then the connection closes.
        c.send(wire.Hello(4, 2))
        assert c.recv() == wire.Hello(17, 5)
        assert c.closed_by_server()
    assert _segment_events_raw(bridge.port) == [b"a", b"b"]


def _segment_events_raw(port: int) -> list[bytes]:
    with SegmentTestClient(port) as c:
        return c.read_all(SEG)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["interval", "never"])
def test_other_fsync_policies_ack_and_serve_reads(device, tmp_path, policy) -> None:
    b = start_segment(device.router, tmp_path / policy, "--fsync", policy, "--fsync-interval", "0.2")
    try:
        with SegmentTestClient(b.port) as c:
            c.hello()
            w = writer_ready(c)
            for i in range(5):
                c.append(w, [js(n=i * 10 + k) for k in range(10)], (i + 1) * 10, split_at=(20 if i % 2 else None))
            assert [c.expect(wire.DataAppended).event_number for _ in range(5)] == [10, 20, 30, 40, 50]
            assert [orjson.loads(p)["n"] for p in c.read_all(SEG)] == list(range(50))
    finally:
        stop_bridge(b)


def _metrics(port: int) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


@pytest.mark.timeout(60)
def test_device_rejection_is_an_error_message_and_counted(device, tmp_path) -> None:
    # The device refuses topics outside its known prefixes with "400 Bad Request".
    mport = free_port()
    b = start_segment(device.router, tmp_path / "data", "--topic", "bogus.segment", "--metrics-port", str(mport))
    try:
        with SegmentTestClient(b.port) as c:
            c.hello()
            w = writer_ready(c)
            c.append(w, [js(n=1), js(n=2)], 2, request_id=31)
            err = c.expect(wire.ErrorMessage)
            assert err.request_id == 31 and err.segment == SEG and "rejected 2" in err.message
            assert c.closed_by_server()
        with SegmentTestClient(b.port) as c:
            c.hello()
            # The events are in the segment (and count as forwarded): the writer resumes after them.
            assert c.setup_append(w, SEG).last_event_number == 2
            assert len(c.read_all(SEG)) == 2
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as bad:
            bad.sendall(struct.pack(">ii", 6, 0))  # unknown command type
            assert bad.recv(10) == b""
        labels = '{protocol="segment"}'

        def counted() -> dict[str, float] | None:
            m = _metrics(mport)
            return m if m.get('logjam_bridge_protocol_errors_total{protocol="segment",reason="unknown_command"}') == 1 else None

        m = wait_for(counted, timeout=10, what="the protocol error to be counted")
        assert m[f"logjam_bridge_device_rejected_total{labels}"] == 2
        assert m[f"logjam_bridge_events_received_total{labels}"] == 2
        assert m.get(f"logjam_bridge_events_acked_total{labels}", 0) == 0
    finally:
        out = stop_bridge(b)
    assert "device rejected 2 of 2" in out


# ---------------------------------------------------------------- bad peers


@pytest.mark.timeout(60)
def test_garbage_and_oversize_headers_next_to_a_good_one(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    with SegmentTestClient(bridge.port) as good:
        good.hello()
        w = writer_ready(good)
        data = good.engine.append(w, [js(n=i) for i in range(10)], 10, 1, split_at=30)
        good.send_raw(data[:25])  # half a command
        bad = [socket.create_connection(("127.0.0.1", bridge.port), timeout=10) for _ in range(5)]
        bad[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # an unknown command type
        bad[1].sendall(struct.pack(">ii", 3, 0x7FFFFFF0))  # a 2 GiB AppendBlock: refused on the header
        bad[2].sendall(struct.pack(">ii", 100, 0xFFFFFF - 7))  # one byte over 16 MiB - 1
        bad[3].sendall(struct.pack(">ii", 9, -1))  # negative length
        bad[4].sendall(os.urandom(4096))
        for s in bad:
            s.settimeout(10)
            assert s.recv(100) == b""  # closed by the bridge without the body ever arriving
            s.close()
        good.send_raw(data[25:])
        assert good.expect(wire.DataAppended).event_number == 10
    got = collect(sub, bridge.app_env, 10)
    assert sorted(b["n"] for _, b in got) == list(range(10))
    sub.close()


@pytest.mark.timeout(90)
def test_client_vanishing_while_acks_wait_on_the_device_leaks_nothing(device, tmp_path) -> None:
    mport = free_port()
    b = start_segment(device.router, tmp_path / "data", "--metrics-port", str(mport), "--fsync", "never")
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    stopped = False
    try:
        c = SegmentTestClient(b.port)
        c.hello()
        w = writer_ready(c)
        os.kill(device.proc.pid, signal.SIGSTOP)
        stopped = True
        for i in range(40):  # more than --pipeline-depth: the bridge stops reading
            c.append(w, [js(n=i * 10 + k) for k in range(10)], (i + 1) * 10)
        # A reset discards what the bridge has not read yet: wait until it is blocked on its bound.
        data = b.data_dir / "segments" / dir_name(SEG) / "data"
        size = sum(len(wire.event_bytes(js(n=n))) for n in range(320))
        wait_for(lambda: data.stat().st_size >= size, timeout=20, what="32 appends stored")
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # a reset, with acks still owed
        os.kill(device.proc.pid, signal.SIGCONT)
        stopped = False
        active = 'logjam_bridge_connections_active{protocol="segment"}'
        wait_for(lambda: _metrics(mport).get(active) == 0, timeout=30, what="the session to end")
        with SegmentTestClient(b.port) as c2:
            c2.hello()
            stored = [orjson.loads(p)["n"] for p in c2.read_all(SEG)]
        assert stored == list(range(len(stored))) and len(stored) >= 320
        # Everything the bridge took in reached the device once, acked or not.
        got = collect(sub, b.app_env, len(stored), timeout=30)
        got += drain(sub, b.app_env, 0.5)
        assert sorted(body["n"] for _, body in got) == stored
    finally:
        if stopped:
            os.kill(device.proc.pid, signal.SIGCONT)
        sub.close()
        stop_bridge(b)


# ---------------------------------------------------------------- TLS


@pytest.mark.timeout(60)
def test_tls(device, certs, tmp_path) -> None:
    b = start_segment(device.router, tmp_path / "data", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        with SegmentTestClient(b.port, tls=client_tls(certs)) as c:
            c.hello()
            w = writer_ready(c)
            c.append(w, [js(n=i) for i in range(20)], 20, split_at=100)
            assert c.expect(wire.DataAppended).event_number == 20
        got = collect(sub, b.app_env, 20)
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["version"] in ("TLSv1.2", "TLSv1.3") and tls["cipher"] and tls["cn"] is None
        # Plain TCP to the TLS port is not served.
        # Everything the bridge sends back until it closes: at most a TLS alert record, never
        # a segment-protocol reply (a Hello answer starts with its type, 0xffffff81).
        with socket.create_connection(("127.0.0.1", b.port), timeout=20) as plain:
            plain.sendall(wire.SegmentClient().send(wire.Hello()))
            got = b""
            try:
                while chunk := plain.recv(4096):
                    got += chunk
            except ConnectionError:
                pass
            assert got == b"" or got[0] == 0x15, got[:16]
        assert drain(sub, b.app_env, 0.3) == []
        sub.close()
    finally:
        stop_bridge(b)


def _refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        with SegmentTestClient(port, tls=ctx, timeout=10) as c:
            c.send(wire.Hello())
            c.recv()
            return False
    except (ssl.SSLError, ConnectionError, ServerClosed, OSError):
        return True


@pytest.mark.timeout(60)
def test_mutual_tls_and_refusals(device, certs, tmp_path) -> None:
    b = start_segment(
        device.router, tmp_path / "data", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
    )
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        with SegmentTestClient(b.port, tls=client_tls(certs, cert=True)) as c:
            c.hello()
            w = writer_ready(c)
            c.append(w, [js(n=i) for i in range(5)], 5)
            assert c.expect(wire.DataAppended).event_number == 5
        got = collect(sub, b.app_env, 5)
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["cn"] == "test-client" and "test-client" in tls["subject"]
        assert _refused(b.port, client_tls(certs))
        assert _refused(b.port, client_tls(certs, other=True))
        assert drain(sub, b.app_env, 0.3) == []
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- device paused


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("bound", "per_append"), [
    ([], 50),  # --pipeline-depth stops reading first
    (["--pipeline-depth", "100000", "--max-pending-bytes", "300000"], 250),  # the byte bound does
])
def test_device_paused_no_ack_keepalives_flat_memory_then_everything_once(device, tmp_path, bound, per_append) -> None:
    b = start_segment(device.router, tmp_path / "data", "--fsync", "never", *bound)
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    stopped = False
    try:
        c = SegmentTestClient(b.port)
        c.hello()
        w = writer_ready(c)
        sock = c.sock
        sock.settimeout(0.5)
        replies: list[wire.Reply] = []
        sent = 0
        last_progress = time.monotonic()
        halt = threading.Event()
        pad = "x" * 150

        def progressed() -> None:
            nonlocal last_progress
            last_progress = time.monotonic()

        def pump() -> None:
            nonlocal sent
            engine = wire.SegmentClient()
            while not halt.is_set():
                nums = range(sent + 1, sent + per_append + 1)
                if send_unless_halted(sock, engine.append(w, [js(n=i, pad=pad) for i in nums], nums[-1]), halt, progressed):
                    sent = nums[-1]

        def more() -> bool:
            return not halt.is_set() or (not replies or getattr(replies[-1], "event_number", 0) < sent)

        def acked() -> int:
            return max((r.event_number for r in replies if isinstance(r, wire.DataAppended)), default=0)

        pump_thread = threading.Thread(target=pump, daemon=True)
        reply_thread = threading.Thread(target=read_replies, args=(sock, wire.SegmentClient().feed, replies, more), daemon=True)
        pump_thread.start()
        reply_thread.start()
        wait_for(lambda: acked() > 2000, timeout=30, what="acks while the device runs")

        os.kill(device.proc.pid, signal.SIGSTOP)
        stopped = True
        wait_for(lambda: time.monotonic() - last_progress > 1.5, timeout=40, interval=0, what="the sender to be back-pressured")
        highest = acked()
        rss_stalled = b.rss_kib()
        n_replies = len(replies)
        # KeepAlives keep the client waiting (interval 0.5 s) but nothing new is acknowledged.
        wait_for(lambda: sum(isinstance(r, wire.KeepAlive) for r in replies[n_replies:]) >= 3, timeout=10, what="keepalives while paused")
        assert acked() == highest and sent > highest
        rss_later = b.rss_kib()
        assert rss_later - rss_stalled < 8 * 1024, (rss_stalled, rss_later)
        assert rss_later < 400 * 1024

        os.kill(device.proc.pid, signal.SIGCONT)
        stopped = False
        halt.set()
        pump_thread.join(5)
        total = sent
        wait_for(lambda: acked() == total, timeout=60, what=f"the ack for {total}")
        got = collect(sub, b.app_env, total, timeout=60)
        numbers = [body["n"] for _, body in got]
        assert sorted(numbers) == list(range(1, total + 1))
        assert drain(sub, b.app_env, 0.5) == []
        reply_thread.join(5)
        c.close()
        sub.close()
    finally:
        if stopped:
            os.kill(device.proc.pid, signal.SIGCONT)
        stop_bridge(b)


# ---------------------------------------------------------------- --app-env-field


@pytest.mark.timeout(60)
def test_app_env_field_on_json_payloads(device, tmp_path) -> None:
    b = start_segment(device.router, tmp_path / "data", "--app-env-field", "fields.app")
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        other = ready_subscriber(device.pub, device.router, "shop-prod")
        with SegmentTestClient(b.port) as c:
            c.hello()
            w = writer_ready(c)
            c.append(w, [js(fields={"app": "shop-prod"}, n=1), js(fields={"app": "no dash"}, n=2), b"text 3", js(n=4)], 4)
            c.expect(wire.DataAppended)
        routed = collect(other, "shop-prod", 1)
        assert routed[0][1]["n"] == 1
        fallback = collect(sub, b.app_env, 3)
        assert sorted(body.get("n", 3) for _, body in fallback) == [2, 3, 4]
        other.close()
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- the real client: PyPI `pravega`


@pytest.mark.timeout(90)
def test_pypi_pravega_writer_through_a_minimal_controller(device, bridge) -> None:
    import sys

    import pravega_client

    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    # The controller runs in its own process: the client's blocking calls hold the GIL.
    ctl = start([sys.executable, "-m", "tests.pravega_controller", "--bridge-port", str(bridge.port)], cwd=str(Path(__file__).resolve().parent.parent))
    try:
        line = ctl.stdout.readline()
        assert line.startswith("port "), line + ctl.stdout.read()
        manager = pravega_client.StreamManager(f"tcp://127.0.0.1:{int(line.split()[1])}")
        assert manager.create_scope("mesh")
        assert manager.create_stream("mesh", "logs", 1)
        writer = manager.create_writer("mesh", "logs", 64)
        n = 300
        for i in range(n):
            if i % 3 == 2:
                writer.write_event_bytes(b"\xfe bytes %d" % i)
            else:
                writer.write_event(orjson.dumps({"n": i, "who": "pravega-rust"}).decode() if i % 3 == 0 else f"text {i}")
        writer.flush()
        segment = "mesh/logs/0.#epoch.0"
        with SegmentTestClient(bridge.port) as c:
            c.hello()
            stored = c.read_all(segment)
        assert len(stored) == n and stored[0] == b'{"n":0,"who":"pravega-rust"}' and stored[1] == b"text 1"
        got = collect(sub, bridge.app_env, n)
        assert drain(sub, bridge.app_env, 0.5) == []
        metas = [b["@metadata"] for _, b in got]
        assert {m["segment"] for m in metas} == {segment} and len({m["writer_id"] for m in metas}) == 1
        numbers = sorted(m["event_number"] for m in metas)
        assert numbers == list(range(numbers[0], numbers[0] + n))
        assert metas[0]["protocol_version"] == "15"  # the Rust client's Hello
        bodies = sorted(got, key=lambda g: g[1]["@metadata"]["event_number"])
        assert bodies[0][1]["n"] == 0 and bodies[1][1]["message"] == "text 1" and "message_base64" in bodies[2][1]
    finally:
        assert stop(ctl) == 0
        out = ctl.stdout.read()
        sub.close()
    calls = next(line for line in out.splitlines() if line.startswith("calls")).split()
    assert {"createScope", "createStream", "getCurrentSegments", "getURI"} <= set(calls), out


PRAVEGA_WRITER = """
import sys, orjson, pravega_client
manager = pravega_client.StreamManager(sys.argv[1])
manager.create_scope("mesh")
manager.create_stream("mesh", "logs", 1)
writer = manager.create_writer("mesh", "logs", 128)
for i in range(int(sys.argv[2])):
    writer.write_event(orjson.dumps({"n": i, "pad": "p" * 100}).decode())
writer.flush()
print("flushed", flush=True)
"""


@pytest.mark.timeout(120)
def test_pypi_pravega_writer_resumes_exactly_once_after_sigkill(device, tmp_path) -> None:
    """The real client reconnects by itself; AppendSetup tells it where to resume."""
    import sys

    repo = str(Path(__file__).resolve().parent.parent)
    port = free_port()
    b = start_segment(device.router, tmp_path / "data", port=port)
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    ctl = start([sys.executable, "-m", "tests.pravega_controller", "--bridge-port", str(port)], cwd=repo)
    b2 = None
    try:
        cport = int(ctl.stdout.readline().split()[1])
        n = 20000
        writer = start([sys.executable, "-c", PRAVEGA_WRITER, f"tcp://127.0.0.1:{cport}", str(n)], cwd=repo)
        data = b.data_dir / "segments" / dir_name("mesh/logs/0.#epoch.0") / "data"
        wait_for(lambda: data.exists() and data.stat().st_size > 300_000, timeout=60, what="the writer to be mid-stream")
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        assert data.stat().st_size < n * 100, "the kill came too late to be mid-stream"
        b2 = start_segment(device.router, b.data_dir, app_env=b.app_env, port=port)
        assert writer.wait(90) == 0
        assert "flushed" in writer.stdout.read()
        with SegmentTestClient(port) as c:
            c.hello()
            stored = [orjson.loads(p)["n"] for p in c.read_all("mesh/logs/0.#epoch.0")]
        assert stored == list(range(n))  # exactly once, in order, in the segment
        got = collect(sub, b.app_env, n, timeout=60)
        got += drain(sub, b.app_env, 1.0)
        unique = {(body["@metadata"]["segment"], body["@metadata"]["segment_offset"]): body["n"] for _, body in got}
        assert sorted(unique.values()) == list(range(n))  # nothing lost at the device
    finally:
        stop(ctl)
        sub.close()
        if b2 is not None:
            stop_bridge(b2)
