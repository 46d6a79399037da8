"""The segment and rustlog bridges with their store on a full disk (a real, small tmpfs with a
filler file): they stay up, acknowledge nothing they could not store, log it once, show it
in their metrics, and go on by themselves once the filler is deleted.

Segment (Pravega has no "try later" reply): the append is held, KeepAlives flow, the
connection stays. RustLog: the protocol's own error (JSON 507 InsufficientSpace, binary 500).
"""

from __future__ import annotations

import json
import struct
import threading
import time
import uuid
from pathlib import Path

import pytest

from bridges.segment import engine as wire
from bridges.segment.store import RECORD_SIZE, dir_name
from tests.bridge_support import collect, drain, read_replies, ready_subscriber, send_unless_halted, start_bridge, stop_bridge
from tests.disk_support import fill, small_tmpfs
from harness.processes import free_port, stop, wait_for
from tests.rustlog_clients import BinaryClient, JsonClient, RawConn
from harness.segment_client import SegmentTestClient
from tests.test_device_disk_full import settled
from tests.test_device_helpers import scrape

pytestmark = pytest.mark.timeout(150)

SEG = "mesh/full/0.#epoch.0"


def store_metrics(port: int, protocol: str) -> tuple[float, float]:
    m = scrape(port)
    label = (("protocol", protocol),)
    return m[("logjam_bridge_store_writable", label)], m[("logjam_bridge_store_write_failures_total", label)]


def segment_files_agree(seg_dir: Path) -> None:
    """The index covers the data file exactly: no torn or unindexed bytes."""
    index = (seg_dir / "index").read_bytes()
    assert len(index) % RECORD_SIZE == 0
    end = struct.unpack_from(">Q", index, len(index) - RECORD_SIZE + 8)[0] if index else 0
    assert end == (seg_dir / "data").stat().st_size


def test_segment_bridge_holds_appends_on_a_full_disk_and_resumes(device, tmp_path) -> None:
    # Room enough that the writer, who sends without waiting for acks, does not fill it again.
    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        metrics = free_port()
        b = start_bridge("segment", device.router, "--keepalive-interval", "0.5", "--metrics-port", str(metrics),
                         data_dir=disk / "data")
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        halt = threading.Event()
        replies: list[wire.Reply] = []
        sent = 0
        try:
            c = SegmentTestClient(b.port)
            c.hello()
            writer = uuid.uuid4()
            assert isinstance(c.create_segment(SEG), wire.SegmentCreated)
            assert isinstance(c.setup_append(writer, SEG), wire.AppendSetup)
            sock = c.sock
            sock.settimeout(0.5)

            def pump() -> None:
                nonlocal sent
                engine = wire.SegmentClient()
                pad = "x" * 1000
                while not halt.is_set():
                    nums = range(sent + 1, sent + 21)
                    data = engine.append(writer, [json.dumps({"n": i, "pad": pad}).encode() for i in nums], nums[-1])
                    if send_unless_halted(sock, data, halt):
                        sent = nums[-1]

            def acked() -> int:
                return max((r.event_number for r in replies if isinstance(r, wire.DataAppended)), default=0)

            filler = fill(disk, leave=500 * 1024)
            pump_thread = threading.Thread(target=pump, daemon=True)
            def more() -> bool:
                return not halt.is_set() or acked() < sent

            reply_thread = threading.Thread(target=read_replies, args=(sock, wire.SegmentClient().feed, replies, more), daemon=True)
            pump_thread.start()
            reply_thread.start()
            wait_for(lambda: store_metrics(metrics, "segment")[0] == 0, timeout=60, what="the store to be full")
            held = settled(acked)  # appends stored before the disk filled are still acknowledged
            n_replies = len(replies)
            # KeepAlives, no acks, no error, the connection open; attempts are counted.
            wait_for(lambda: sum(isinstance(r, wire.KeepAlive) for r in replies[n_replies:]) >= 4, timeout=15,
                     what="keepalives while the disk is full")
            assert acked() == held and sent > held and reply_thread.is_alive()
            assert not [r for r in replies if not isinstance(r, (wire.DataAppended, wire.KeepAlive))]
            assert store_metrics(metrics, "segment")[1] >= 2
            segment_files_agree(disk / "data" / "segments" / dir_name(SEG))

            filler.unlink()
            wait_for(lambda: acked() > held + 200, timeout=30, what="acks after the space came back")
            assert store_metrics(metrics, "segment")[0] == 1
            halt.set()
            pump_thread.join(10)
            total = sent
            wait_for(lambda: acked() == total, timeout=60, what=f"the ack for {total}")
            got = collect(sub, b.app_env, total, timeout=60)
            assert sorted(body["n"] for _, body in got) == list(range(1, total + 1))
            assert drain(sub, b.app_env, 0.5) == []
            reply_thread.join(5)
            c.close()
            out = stop_bridge(b)
        finally:
            halt.set()
            sub.close()
            if stop(b.proc) is not None and b.proc.stdout and not b.proc.stdout.closed:
                print(b.output())
        segment_files_agree(disk / "data" / "segments" / dir_name(SEG))
    failed = [line for line in out.splitlines() if "segment store write failed" in line]
    assert len(failed) == 1 and "No space left on device" in failed[0], out[-3000:]
    assert failed[0].endswith("holding appends until it can write")
    assert out.count("segment store writable again after") == 1
    assert "Traceback" not in out


def test_rustlog_bridge_answers_507_on_a_full_disk_and_resumes(device, tmp_path) -> None:
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        metrics = free_port()
        b = start_bridge("rustlog", device.router, "--metrics-port", str(metrics), "--segment-bytes", "65536",
                         data_dir=disk / "data")
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        try:
            with RawConn(b.port) as conn:
                j, bc = JsonClient(conn), BinaryClient(conn)
                j.create("t", 1)
                filler = fill(disk, leave=400 * 1024)
                acked = 0
                attempt = 0
                while True:
                    records = [json.dumps({"ok": acked + i, "pad": "x" * 1000}).encode() for i in range(50)]
                    resp = j.produce("t", 0, records)
                    if resp["type"] != "ProduceResponse":
                        break
                    assert resp["base_offset"] == acked
                    acked += 50
                    attempt += 1
                    assert attempt < 1000, "the disk never filled"
                assert resp["type"] == "Error" and resp["code"] == 507, resp
                # Every dialect, every attempt: the protocol's error, nothing stored (records too big
                # for the few KiB a nearly full disk may still have).
                assert bc.produce("t", 0, [json.dumps({"never": 1, "pad": "x" * 200_000}).encode()])[:2] == ("error", 500)
                for _ in range(3):
                    assert j.produce("t", 0, [json.dumps({"never": 2, "pad": "x" * 200_000}).encode()])["code"] == 507
                described = j.call(type="DescribePartition", topic="t", partition=0)
                assert described["high_watermark"] == acked, described
                values = j.call(type="MetricsFetch")
                assert values["store_writable"] == 0 and values["store_write_failures_total"] >= 5
                assert store_metrics(metrics, "rustlog") == (0, values["store_write_failures_total"])

                filler.unlink()
                resp = j.produce("t", 0, [json.dumps({"ok": acked + i}).encode() for i in range(10)])
                assert resp == {"type": "ProduceResponse", "base_offset": acked, "record_count": 10}, resp
                acked += 10
                assert j.call(type="MetricsFetch")["store_writable"] == 1
                offsets = [o for o, _, _ in j.fetch_all("t", 0, max_bytes=1 << 20)]
                assert offsets == list(range(acked))
            time.sleep(0.2)
            got = [body for m, body in collect(sub, b.app_env, acked, timeout=60)]
            assert sorted(body["ok"] for body in got) == list(range(acked))  # nothing refused ever reached the device
            assert drain(sub, b.app_env, 0.5) == []
            out = stop_bridge(b)
        finally:
            sub.close()
            stop(b.proc)
    failed = [line for line in out.splitlines() if "rustlog log write failed" in line]
    assert len(failed) == 1 and "No space left on device" in failed[0], out[-3000:]
    assert out.count("rustlog log writable again after") == 1
    assert "Traceback" not in out
