"""`logjam-bridge rustlog` over real sockets, with a real logjam-device and subscriber."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from logjam.message import Message
from logjam.subscriber import Subscriber
from tests.bridge_support import BridgeProcess, client_tls, ready_subscriber, start_bridge, stop_bridge
from harness.processes import start, wait_for
from tests.rustlog_clients import BinaryClient, JsonClient, RawConn, b_list, b_str, binary_response

MAX = 10 * 1024 * 1024


def start_rustlog(device, data_dir: Path, *extra: str, **kwargs: Any) -> BridgeProcess:
    """`logjam-bridge rustlog` storing its topics under `data_dir`."""
    return start_bridge("rustlog", device.router, *extra, data_dir=data_dir, **kwargs)


def collect(sub: Subscriber, n: int, timeout: float = 30.0, settle: float = 0.3) -> list[tuple[Message, dict[str, Any]]]:
    """Exactly the rustlog messages that arrive: at least n, and then nothing more for `settle` s."""
    got: list[tuple[Message, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for m in sub.recv_batch(timeout=0.2):
            if isinstance(m, Message) and m.topic == "logs.rustlog":
                got.append((m, m.json()))
    assert len(got) >= n, f"only {len(got)} of {n} messages reached the subscriber"
    for m in sub.recv_batch(timeout=settle):
        if isinstance(m, Message) and m.topic == "logs.rustlog":
            got.append((m, m.json()))
    return got


@pytest.fixture
def bridge(device, tmp_path):
    b = start_rustlog(device, tmp_path / "data", "--segment-bytes", "4096", "--index-interval-bytes", "512")
    yield b
    stop_bridge(b)


def json_records(tag: str, n: int, start: int = 0) -> list[bytes]:
    return [json.dumps({"tag": tag, "i": i, "pad": "x" * 40}).encode() for i in range(start, start + n)]


# ---------------------------------------------------------------- round trips


@pytest.mark.timeout(90)
def test_produce_fetch_round_trip_across_segment_rolls_and_every_record_reaches_the_device(device, tmp_path) -> None:
    b = start_rustlog(device, tmp_path / "data", "--segment-bytes", "4096", "--index-interval-bytes", "512",
                     "--app-env-map", "mapped=mapped-env")
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    sub_mapped = ready_subscriber(device.pub, device.router, "mapped-env")
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            assert j.create("events", 2) == {"type": "CreateTopicResponse", "success": True, "partitions_created": 2}
            assert bc.create("mapped", 1) == ("create", 1)
            expected: list[bytes] = []
            for k in range(3):
                batch = json_records("json", 100, 100 * k)
                assert j.produce("events", 1, batch) == {"type": "ProduceResponse", "base_offset": len(expected), "record_count": 100}
                expected += batch
            texts = [f"line {i}".encode() for i in range(50)] + [b"\xff\xfe binary"]
            assert bc.produce("events", 1, texts) == ("produce", 300, 51)
            expected += texts
            assert j.produce("mapped", 0, [b'{"m": 1}']) == {"type": "ProduceResponse", "base_offset": 0, "record_count": 1}

            fetched = j.fetch_all("events", 1, max_bytes=700)
            assert [f[0] for f in fetched] == list(range(len(expected)))
            assert [f[2] for f in fetched] == expected
            assert all(f[1] > 1_600_000_000_000_000 for f in fetched)  # microseconds
            assert bc.fetch_all("events", 1, max_bytes=700) == expected
            assert j.fetch_all("events", 0) == []

            desc = j.call(type="DescribeTopic", topic="events")
            p1 = desc["partitions"][1]
            assert p1["high_watermark"] == 351 and p1["log_start_offset"] == 0 and p1["segment_count"] > 5
            assert desc["partitions"][0] == {"partition": 0, "high_watermark": 0, "log_start_offset": 0, "segment_count": 1}
            assert bc.describe_topic("events") == ("describe_topic", "events", 2, [(0, 0), (1, 351)])
            assert bc.describe_partition("events", 1) == ("describe_partition", "events", 1, 351)
            dp = j.call(type="DescribePartition", topic="events", partition=1)
            assert dp["type"] == "DescribePartitionResponse" and dp["high_watermark"] == 351 and dp["segment_count"] == p1["segment_count"]
            assert j.call(type="ListTopics")["topics"] == [{"name": "events", "partition_count": 2}, {"name": "mapped", "partition_count": 1}]
            assert bc.list_topics() == ("topics", [("events", 2), ("mapped", 1)])
            assert j.call(type="Ping") == {"type": "Pong"}
            assert bc.ping() == ("pong",)

            metrics = j.call(type="MetricsFetch")
            assert metrics["type"] == "MetricsFetchResponse"
            assert metrics["records_in_total"] == 352 and metrics["records_out_total"] >= 2 * 351
            assert metrics["bytes_in_total"] == sum(map(len, expected)) + 8
            assert metrics["connections_total"] >= 1 and metrics["connections_active"] >= 1
            assert metrics["produce_latency_seconds_count"] == 5 and metrics["fetch_latency_seconds_count"] > 0
            kind, text = bc.metrics()
            assert kind == "metrics" and "# TYPE rustlog_records_in_total counter" in text
            assert "rustlog_records_in_total 352" in text

        got = collect(sub, 351)
        assert len(got) == 351
        by_offset = {body["@metadata"]["offset"]: (m, body) for m, body in got}
        assert sorted(by_offset) == list(range(351))
        for off, (m, body) in by_offset.items():
            meta = body.pop("@metadata")
            assert m.app_env == b.app_env
            assert meta["protocol"] == "rustlog" and meta["topic"] == "events" and meta["partition"] == 1
            assert meta["protocol_version"] == ("json" if off < 300 else "binary")
            assert meta["peer"].startswith("127.0.0.1:") and isinstance(meta["received_at"], int)
            if off < 300:
                assert body == json.loads(expected[off])
            elif off < 350:
                assert body == {"message": f"line {off - 300}"}
            else:
                assert body == {"message_base64": base64.b64encode(b"\xff\xfe binary").decode()}
        mapped = collect(sub_mapped, 1)
        assert len(mapped) == 1 and mapped[0][0].app_env == "mapped-env" and mapped[0][1]["m"] == 1
    finally:
        sub.close()
        sub_mapped.close()
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_concurrent_producers_on_one_partition(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    try:
        with RawConn(bridge.port) as c:
            JsonClient(c).create("shared", 1)
        bases: list[int] = []
        failures: list[BaseException] = []

        def producer(k: int) -> None:
            try:
                with RawConn(bridge.port) as c:
                    client = JsonClient(c) if k % 2 else BinaryClient(c)
                    for n in range(10):
                        batch = [json.dumps({"k": k, "n": n, "i": i}).encode() for i in range(50)]
                        resp = client.produce("shared", 0, batch)
                        bases.append(resp["base_offset"] if isinstance(resp, dict) else resp[1])
            except BaseException as err:  # reported below; a thread cannot fail the test itself
                failures.append(err)

        threads = [threading.Thread(target=producer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        assert sorted(bases) == list(range(0, 1500, 50))
        with RawConn(bridge.port) as c:
            fetched = JsonClient(c).fetch_all("shared", 0, max_bytes=1 << 20)
        assert [f[0] for f in fetched] == list(range(1500))
        keys = {(d["k"], d["n"], d["i"]) for d in (json.loads(f[2]) for f in fetched)}
        assert len(keys) == 1500
        got = collect(sub, 1500)
        assert len(got) == 1500
        assert {body["@metadata"]["offset"] for _, body in got} == set(range(1500))
    finally:
        sub.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_restart_keeps_data_topics_and_committed_offsets(device, tmp_path, fsync) -> None:
    data = tmp_path / "data"
    b = start_rustlog(device, data, "--segment-bytes", "2048", "--fsync", fsync, "--fsync-interval-ms", "50")
    records = json_records("r", 120)
    with RawConn(b.port) as c:
        j, bc = JsonClient(c), BinaryClient(c)
        j.create("keep", 3)
        assert j.produce("keep", 2, records)["base_offset"] == 0
        assert j.call(type="OffsetCommit", group="g1", topic="keep", partition=2, offset=40) == {"type": "OffsetCommitResponse", "success": True}
        assert bc.commit("g2", "keep", 2, 100) == ("commit", 1)
        assert j.call(type="OffsetCommit", group="g1", topic="keep", partition=2, offset=50)["success"] is True
    stop_bridge(b)

    b = start_rustlog(device, data, "--segment-bytes", "2048", "--fsync", fsync, port=b.port)
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            assert j.call(type="ListTopics")["topics"] == [{"name": "keep", "partition_count": 3}]
            assert [f[2] for f in j.fetch_all("keep", 2)] == records
            assert j.call(type="OffsetFetch", group="g1", topic="keep", partition=2) == {"type": "OffsetFetchResponse", "offset": 50}
            assert bc.offset_fetch("g2", "keep", 2) == ("offset", 100)
            assert bc.offset_fetch("nobody", "keep", 2) == ("offset", None)
            assert j.call(type="OffsetFetch", group="nobody", topic="keep", partition=1)["offset"] is None
            # Binary Fetch with a group reads from the group's committed offset (the reference).
            kind, got, nxt = bc.fetch("keep", 2, 0, 1 << 20, group_id="g2")
            assert got == records[100:] and nxt == 120
            assert bc.fetch("keep", 2, 7, group_id="nobody") == ("fetch", [], 0)
            # Offsets keep counting after the restart.
            assert j.produce("keep", 2, [b"after"])["base_offset"] == 120
    finally:
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_retention_by_size_moves_log_start_then_416(device, tmp_path) -> None:
    b = start_rustlog(device, tmp_path / "data", "--segment-bytes", "2048", "--retention-bytes", "4096",
                     "--retention-check-interval-ms", "100")
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            j.create("ret", 1)
            for _ in range(5):
                j.produce("ret", 0, json_records("ret", 40))

            def moved() -> dict | None:
                p = j.call(type="DescribeTopic", topic="ret")["partitions"][0]
                # Retention runs every 100 ms, maybe between two batches: wait for it to catch up.
                return p if p["log_start_offset"] > 0 and p["segment_count"] <= 3 else None

            p = wait_for(moved, timeout=10, what="retention to move log_start_offset")
            start, hw = p["log_start_offset"], p["high_watermark"]
            assert hw == 200 and p["segment_count"] <= 3
            err = j.fetch("ret", 0, 0)
            assert err["type"] == "Error" and err["code"] == 416
            assert err["details"] == {"valid_range": {"start": start, "end": hw}, "high_watermark": hw}
            assert bc.fetch("ret", 0, 0) == ("fetch", [], 0)  # the reference: empty, next_offset = requested
            assert [f[0] for f in j.fetch_all("ret", 0, start)] == list(range(start, hw))
            assert j.fetch("ret", 0, hw + 5) == {"type": "FetchResponse", "records": [], "next_offset": hw + 5}
    finally:
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_retention_by_age_empties_the_partition(device, tmp_path) -> None:
    b = start_rustlog(device, tmp_path / "data", "--retention-ms", "300", "--retention-check-interval-ms", "100")
    try:
        with RawConn(b.port) as c:
            j = JsonClient(c)
            j.create("aged", 1)
            j.produce("aged", 0, json_records("a", 30))

            def expired() -> bool:
                p = j.call(type="DescribePartition", topic="aged", partition=0)
                return p["log_start_offset"] == 30 and p["high_watermark"] == 30

            wait_for(expired, timeout=10, what="age retention")
            assert j.fetch("ret" if False else "aged", 0, 29)["code"] == 416
            assert j.produce("aged", 0, [b"new"])["base_offset"] == 30
            assert [f[2] for f in j.fetch_all("aged", 0, 30)] == [b"new"]
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- errors


def test_every_json_error_code_and_the_connection_stays_open(device, bridge) -> None:
    with RawConn(bridge.port) as c:
        j = JsonClient(c)
        j.create("errs", 2)
        cases = [
            ({"type": "Nope"}, 400),
            ({"topic": "errs"}, 400),
            ({"type": "Produce", "topic": "errs", "partition": "0", "records": []}, 400),
            ({"type": "Produce", "topic": "errs", "partition": 0, "records": ["not base64!"]}, 400),
            ({"type": "Produce", "topic": "bad name!", "partition": 0, "records": []}, 400),
            ({"type": "Produce", "topic": "x" * 256, "partition": 0, "records": []}, 400),
            ({"type": "Produce", "topic": "errs", "partition": 0, "records": ["QQ=="] * 1001}, 400),
            ({"type": "Produce", "topic": "errs", "partition": -1, "records": []}, 400),
            ({"type": "CreateTopic", "topic": "t0", "partition_count": 0}, 400),
            ({"type": "CreateTopic", "topic": "t1001", "partition_count": 1001}, 400),
            ({"type": "Produce", "topic": "missing", "partition": 0, "records": []}, 404),
            ({"type": "Fetch", "group_id": "", "topic": "missing", "partition": 0, "offset": 0, "max_bytes": 10}, 404),
            ({"type": "DescribeTopic", "topic": "missing"}, 404),
            ({"type": "Produce", "topic": "errs", "partition": 2, "records": []}, 405),
            ({"type": "Fetch", "group_id": "", "topic": "errs", "partition": 9, "offset": 0, "max_bytes": 10}, 405),
            ({"type": "DescribePartition", "topic": "errs", "partition": 2}, 405),
            ({"type": "OffsetFetch", "group": "g", "topic": "errs", "partition": 5}, 405),
        ]
        for request, code in cases:
            resp = j.call(**request)
            assert resp["type"] == "Error" and resp["code"] == code, (request, resp)
            assert isinstance(resp["message"], str) and "details" in resp
        assert j.call(type="DescribeTopic", topic="missing")["details"] == {"available_topics": ["errs"]}
        # Spec: success false, not an error, for commits to unknown partitions and existing topics.
        assert j.call(type="OffsetCommit", group="g", topic="nope", partition=0, offset=1) == {"type": "OffsetCommitResponse", "success": False}
        assert j.create("errs", 1) == {"type": "CreateTopicResponse", "success": False, "partitions_created": 0}
        assert j.call(type="Ping") == {"type": "Pong"}  # still open


def test_every_binary_error_code_and_the_connection_stays_open(device, bridge) -> None:
    with RawConn(bridge.port) as c:
        bc = BinaryClient(c)
        assert bc.create("errs", 2) == ("create", 1)
        assert bc.call(b"\x42")[:2] == ("error", 2)  # unknown type
        assert bc.call(b"\x01\x00")[:2] == ("error", 2)  # truncated
        assert bc.call(b"\x07" + b_str("errs") + b"extra")[:2] == ("error", 2)
        assert bc.call(b"\x07\x00\x02\xff\xfe")[:2] == ("error", 2)  # invalid UTF-8 in a string
        assert bc.call(b"\x01" + b_str("errs") + struct.pack(">II", 0, 1001))[:2] == ("error", 2)
        assert bc.produce("missing", 0, [b"x"])[:2] == ("error", 10)
        assert bc.produce("errs", 5, [b"x"])[:2] == ("error", 10)
        assert bc.fetch("missing", 0, 0)[:2] == ("error", 10)
        assert bc.create("errs", 1)[:2] == ("error", 11)
        assert bc.create("zero", 0)[:2] == ("error", 12)
        assert bc.create("many", 1001)[:2] == ("error", 12)
        assert bc.describe_topic("missing")[:2] == ("error", 13)
        assert bc.describe_partition("errs", 2)[:2] == ("error", 14)
        assert bc.describe_partition("missing", 0)[:2] == ("error", 14)
        assert bc.commit("g", "missing", 0, 1)[:2] == ("error", 5)
        assert bc.offset_fetch("g", "missing", 0) == ("offset", None)  # the reference does not check
        assert bc.ping() == ("pong",)


@pytest.mark.timeout(90)
def test_record_too_large_413_with_a_larger_frame_limit(device, tmp_path) -> None:
    b = start_rustlog(device, tmp_path / "data", "--max-frame-size", str(16 * 1024 * 1024))
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            j.create("big", 1)
            resp = j.produce("big", 0, [b"a" * (MAX + 1)])
            assert resp["type"] == "Error" and resp["code"] == 413
            assert bc.produce("big", 0, [b"a" * (MAX + 1)])[:2] == ("error", 2)
            assert j.produce("big", 0, [b"a" * 1000])["base_offset"] == 0
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_device_rejection_is_500(device, tmp_path) -> None:
    # The device refuses topics without a known prefix: a bridge misconfiguration.
    b = start_rustlog(device, tmp_path / "data", "--topic", "bogus.topic")
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            j.create("t", 1)
            resp = j.produce("t", 0, [b"x", b"y"])
            assert resp["type"] == "Error" and resp["code"] == 500 and "rejected 2 of 2" in resp["message"]
            assert bc.produce("t", 0, [b"z"])[:2] == ("error", 500)
            assert j.call(type="MetricsFetch")["device_rejected_total"] == 3
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_storage_errors_503_and_507(device, tmp_path) -> None:
    # 507: the active segment is /dev/full, so every append fails with ENOSPC.
    data = tmp_path / "full"
    part = data / "topics" / "full" / "0"
    part.mkdir(parents=True)
    (data / "topics" / "full" / "topic.json").write_text('{"partition_count": 1}')
    (part / f"{0:020d}.log").symlink_to("/dev/full")
    b = start_rustlog(device, data)
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            resp = j.produce("full", 0, [b"x"])
            assert resp["type"] == "Error" and resp["code"] == 507, resp
            assert bc.produce("full", 0, [b"x"])[:2] == ("error", 500)
            assert j.call(type="Ping") == {"type": "Pong"}
    finally:
        stop_bridge(b)

    # 503 / binary 4: a sealed segment that can no longer be read.
    b = start_rustlog(device, tmp_path / "unreadable", "--segment-bytes", "1024")
    try:
        with RawConn(b.port) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            j.create("t", 1)
            j.produce("t", 0, json_records("u", 40))
            first = b.data_dir / "topics" / "t" / "0" / f"{0:020d}.log"
            first.rename(first.with_suffix(".moved"))
            first.mkdir()  # opening it now fails with EISDIR
            resp = j.fetch("t", 0, 0)
            assert resp["type"] == "Error" and resp["code"] == 503, resp
            assert bc.fetch("t", 0, 0)[:2] == ("error", 4)
            assert j.fetch("t", 0, 39)["records"][0]["offset"] == 39  # later segments still serve
    finally:
        stop_bridge(b)

    # 503: a file-size limit makes writes fail with EFBIG (Python ignores SIGXFSZ).
    limit = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536)); "
             "os.execv(sys.argv[1], sys.argv[1:])")
    b = start_rustlog(device, tmp_path / "fsize", prefix=(sys.executable, "-c", limit))
    try:
        with RawConn(b.port) as c:
            j = JsonClient(c)
            j.create("t", 1)
            assert j.produce("t", 0, [b"x" * 1000])["type"] == "ProduceResponse"
            resp = j.produce("t", 0, [b"x" * 1000] * 100)
            assert resp["type"] == "Error" and resp["code"] == 503, resp
            # Nothing half-written stays behind; the log goes on at the next offset.
            assert j.produce("t", 0, [b"y"])["base_offset"] == 1
            assert [f[2] for f in j.fetch_all("t", 0)] == [b"x" * 1000, b"y"]
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- dialects, framing, garbage


def test_both_dialects_pipelined_on_one_connection(device, bridge) -> None:
    with RawConn(bridge.port) as c:
        JsonClient(c).create("mix", 1)
        frames = [
            json.dumps({"type": "Produce", "topic": "mix", "partition": 0, "records": ["YQ=="]}).encode(),
            b"\x01" + b_str("mix") + struct.pack(">I", 0) + b_list([b"b"]),
            b"\xff",
            json.dumps({"type": "Ping"}).encode(),
            b"\x02" + b_str("") + b_str("mix") + struct.pack(">IQI", 0, 0, 1000),
            json.dumps({"type": "Fetch", "topic": "mix", "partition": 0, "offset": 0, "max_bytes": 1000}).encode(),
            b"\x66",
            json.dumps({"type": "Bogus"}).encode(),
        ]
        c.sock.sendall(b"".join(struct.pack(">I", len(f)) + f for f in frames))
        answers = [c.recv_frame() for _ in frames]
        assert json.loads(answers[0]) == {"type": "ProduceResponse", "base_offset": 0, "record_count": 1}
        assert binary_response(answers[1]) == ("produce", 1, 1)
        assert binary_response(answers[2]) == ("pong",)
        assert json.loads(answers[3]) == {"type": "Pong"}
        assert binary_response(answers[4]) == ("fetch", [b"a", b"b"], 2)
        fetched = json.loads(answers[5])
        assert [r["payload"] for r in fetched["records"]] == ["YQ==", "Yg=="] and fetched["next_offset"] == 2
        assert binary_response(answers[6])[:2] == ("error", 2)
        assert json.loads(answers[7])["code"] == 400


@pytest.mark.timeout(90)
def test_fetch_answers_stay_within_the_frame_limit(device, bridge) -> None:
    with RawConn(bridge.port) as c:
        j, bc = JsonClient(c), BinaryClient(c)
        j.create("wide", 1)
        for _ in range(8):
            assert bc.produce("wide", 0, [os.urandom(2000) for _ in range(1000)])[0] == "produce"
        resp = j.fetch("wide", 0, 0, max_bytes=2**63)  # recv_frame asserts <= 10 MiB
        assert 0 < len(resp["records"]) < 8000 and resp["next_offset"] == len(resp["records"])
        kind, records, nxt = bc.fetch("wide", 0, 0, max_bytes=2**32 - 1)
        assert 0 < len(records) < 8000 and nxt == len(records)
        assert len(bc.fetch_all("wide", 0, max_bytes=2**32 - 1)) == 8000


@pytest.mark.timeout(90)
def test_frame_limits(device, bridge) -> None:
    with RawConn(bridge.port) as c:
        bc = BinaryClient(c)
        bc.create("lim", 1)
        # Exactly MAX_FRAME_SIZE is accepted.
        head = b"\x01" + b_str("lim") + struct.pack(">III", 0, 1, 0)
        record = b"r" * (MAX - len(head))
        payload = b"\x01" + b_str("lim") + struct.pack(">III", 0, 1, len(record)) + record
        assert len(payload) == MAX
        assert bc.call(payload) == ("produce", 0, 1)
    # One byte more: refused from the header alone, with the reference's error 1, then closed.
    with RawConn(bridge.port) as c:
        c.sock.sendall(struct.pack(">I", MAX + 1) + b"\x01")
        assert binary_response(c.recv_frame())[:2] == ("error", 1)
        assert c.closed_by_server()
    with RawConn(bridge.port) as c:
        c.sock.sendall(struct.pack(">I", MAX + 1) + b"{")
        resp = json.loads(c.recv_frame())
        assert resp["type"] == "Error" and resp["code"] == 413
        assert c.closed_by_server()
    with RawConn(bridge.port) as c:
        c.sock.sendall(struct.pack(">I", 0xFFFFFFFF))
        assert c.recv_frame()[:1] == b"\xfe"
        assert c.closed_by_server()
    # A zero length closes the connection; requests before it are still answered.
    with RawConn(bridge.port) as c:
        ping = json.dumps({"type": "Ping"}).encode()
        c.sock.sendall(struct.pack(">I", len(ping)) + ping + struct.pack(">I", 0))
        assert json.loads(c.recv_frame()) == {"type": "Pong"}
        resp = json.loads(c.recv_frame())
        assert resp["type"] == "Error" and resp["code"] == 400
        assert c.closed_by_server()


def test_malformed_json_and_invalid_utf8_close_the_connection(device, bridge) -> None:
    for payload in (b'{"type": "Ping"', b'{"type": "Ping", "x": "\xff\xfe"}', b"{}}", b'{"a": 1} trailing'):
        with RawConn(bridge.port) as c:
            c.send_frame(payload)
            resp = json.loads(c.recv_frame())
            assert resp["type"] == "Error" and resp["code"] == 400, (payload, resp)
            assert c.closed_by_server(), payload


@pytest.mark.timeout(60)
def test_garbage_connections_next_to_a_good_one(device, bridge) -> None:
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    try:
        with RawConn(bridge.port) as good:
            j = JsonClient(good)
            j.create("g", 1)
            bad = [RawConn(bridge.port) for _ in range(4)]
            garbage = [
                os.urandom(64 * 1024),
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                struct.pack(">I", 100) + b"{" + b"\x00" * 99,
                struct.pack(">I", 5) + b"\x01\x00",  # a frame that never completes
            ]
            for conn, data in zip(bad, garbage):
                try:
                    conn.sock.sendall(data)
                except OSError:
                    pass  # cut off mid-send: the bridge may close a garbage client before it is done
            for i in range(10):
                assert j.produce("g", 0, [json.dumps({"n": i}).encode()])["base_offset"] == i
            assert [json.loads(f[2])["n"] for f in j.fetch_all("g", 0)] == list(range(10))
            for conn in bad[:3]:
                wait_for(conn.closed_by_server, timeout=10, what="garbage connection to be closed")
            for conn in bad:
                conn.close()
        assert sorted(body["n"] for _, body in collect(sub, 10)) == list(range(10))
    finally:
        sub.close()


# ---------------------------------------------------------------- TLS


@pytest.mark.timeout(60)
def test_tls(device, tmp_path, certs) -> None:
    b = start_rustlog(device, tmp_path / "data", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        with RawConn(b.port, client_tls(certs)) as c:
            j, bc = JsonClient(c), BinaryClient(c)
            j.create("sec", 1)
            assert j.produce("sec", 0, [b'{"secure": true}'])["record_count"] == 1
            assert bc.produce("sec", 0, [b"plain"]) == ("produce", 1, 1)
            assert [f[2] for f in j.fetch_all("sec", 0)] == [b'{"secure": true}', b"plain"]
        got = collect(sub, 2)
        meta = got[0][1]["@metadata"]
        assert meta["tls"]["version"].startswith("TLS") and meta["tls"]["cipher"]
        # A plaintext client gets nowhere.
        with RawConn(b.port) as plain:
            plain.send_frame(b'{"type": "Ping"}')
            assert plain.closed_by_server()
    finally:
        sub.close()
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_mutual_tls(device, tmp_path, certs) -> None:
    b = start_rustlog(device, tmp_path / "data", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                     "--tls-client-ca", str(certs.ca))
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        with RawConn(b.port, client_tls(certs, cert=True)) as c:
            j = JsonClient(c)
            j.create("m", 1)
            assert j.produce("m", 0, [b'{"mtls": 1}'])["record_count"] == 1
        meta = collect(sub, 1)[0][1]["@metadata"]
        assert meta["tls"]["cn"]
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            with RawConn(b.port, client_tls(certs, cert=False)) as c:
                c.send_frame(b'{"type": "Ping"}')
                if not c.recv_frame():
                    raise ConnectionError("refused")
    finally:
        sub.close()
        stop_bridge(b)


# ---------------------------------------------------------------- the device: paused, and a crash in between


@pytest.mark.timeout(120)
def test_device_paused_no_ack_flat_memory_then_everything_once(device, tmp_path) -> None:
    b = start_rustlog(device, tmp_path / "data", "--max-inflight", "2000")
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    clients = []
    try:
        with RawConn(b.port) as c:
            JsonClient(c).create("p", 4)
        before = b.rss_kib()
        os.kill(device.proc.pid, signal.SIGSTOP)
        try:
            # Four producers, each pipelining 20 batches of 1000 records while the device is stopped.
            for part in range(4):
                conn = RawConn(b.port)
                conn.sock.settimeout(30)
                clients.append(conn)
                for k in range(20):
                    recs = [json.dumps({"p": part, "k": k, "i": i}).encode() for i in range(1000)]
                    frame = b"\x01" + b_str("p") + struct.pack(">I", part) + b_list(recs)
                    conn.sock.setblocking(False)
                    try:
                        conn.sock.sendall(struct.pack(">I", len(frame)) + frame)
                    except BlockingIOError:
                        break  # the bridge stopped reading: back-pressure reached the client
                    finally:
                        conn.sock.setblocking(True)
                        conn.sock.settimeout(30)
            clients[0].sock.settimeout(1.0)
            with pytest.raises(TimeoutError):
                clients[0].recv_frame()
            clients[0].sock.settimeout(30)
            assert b.rss_kib() - before < 80 * 1024, (before, b.rss_kib())
        finally:
            os.kill(device.proc.pid, signal.SIGCONT)
        sent_batches = []
        for conn in clients:
            n = 0
            while True:
                conn.sock.settimeout(5)
                try:
                    frame = conn.recv_frame()
                except TimeoutError:
                    break
                assert binary_response(frame)[0] == "produce"
                n += 1
            sent_batches.append(n)
        total = sum(sent_batches) * 1000
        assert total > 0
        got = collect(sub, total, timeout=60)
        keys = [(body["p"], body["k"], body["i"]) for _, body in got]
        assert len(keys) == len(set(keys)) == total
    finally:
        for conn in clients:
            conn.close()
        sub.close()
        stop_bridge(b)


@pytest.mark.timeout(120)
def test_crash_between_log_and_device_forwards_on_restart(device, tmp_path) -> None:
    data = tmp_path / "data"
    b = start_rustlog(device, data)
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        with RawConn(b.port) as c:
            j = JsonClient(c)
            j.create("crash", 1)
            assert j.produce("crash", 0, [b'{"before": 0}'])["base_offset"] == 0
        assert len(collect(sub, 1)) == 1
        os.kill(device.proc.pid, signal.SIGSTOP)
        try:
            c = RawConn(b.port)
            c.send_frame(json.dumps({"type": "Produce", "topic": "crash", "partition": 0,
                                     "records": [base64.b64encode(json.dumps({"lost?": i}).encode()).decode() for i in range(5)]}).encode())

            def stored() -> bool:
                segment = data / "topics" / "crash" / "0" / f"{0:020d}.log"
                return segment.stat().st_size > 200

            wait_for(stored, timeout=10, what="the batch to reach the log")
            b.proc.kill()  # crash: stored, never accepted by the device, never acknowledged
            b.proc.wait()
            c.close()
        finally:
            os.kill(device.proc.pid, signal.SIGCONT)
        b = start_rustlog(device, data, app_env=b.app_env, port=b.port)
        got = collect(sub, 5)
        # The paused device may have queued the first attempt; at least once, never lost.
        seen = {body["lost?"] for _, body in got}
        assert seen == set(range(5))
        assert all(body["@metadata"]["offset"] in range(1, 6) for _, body in got)
        assert any(body["@metadata"]["protocol_version"] == "recovered" for _, body in got)
        with RawConn(b.port) as c:
            j = JsonClient(c)
            assert j.call(type="MetricsFetch")["records_reforwarded_total"] == 5
            assert j.produce("crash", 0, [b"next"])["base_offset"] == 6
    finally:
        sub.close()
        stop_bridge(b)
