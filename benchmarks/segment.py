"""Benchmark: segment-append (Pravega wire protocol) events/s through `logjam-bridge segment` + `logjam-device`.

A writer sends batched appends (500 events of ~200 bytes each, block form with a
PartialEvent split, as the Java client does) pipelined 16 deep, with the Pravega
test client; the clock stops at the last DataAppended, i.e. when every append is
in the segment store (fsync always, the default) and the device has answered 202
for every event. The reference, measured in the same run on the same bytes, is
the decode-only limit: the sans-IO engine reassembling the appends in-process (no
sockets, store, mapping or device). A second reference adds the mapping into Logjam
messages, to show where the time goes. Prints the rates and ratio bridge / decode-only,
against its target (benchmarks/targets.toml).

Run: .venv/bin/python benchmarks/segment.py [--events N] [--rounds R]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from bridges.host.mapping import EventMapper, Positions  # noqa: E402
from bridges.segment import engine as wire  # noqa: E402
from benchmarks.device_ceiling import describe, device_ceiling  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.processes import command, free_port, port_open, start, stop, wait_for  # noqa: E402
from harness.segment_client import SegmentTestClient  # noqa: E402
from benchmarks.results import Run  # noqa: E402

PER_APPEND = 500
DEPTH = 16
SEGMENT = "bench/logs/0.#epoch.0"


def make_appends(n_events: int, writer: uuid.UUID) -> list[bytes]:
    client = wire.SegmentClient()
    out = []
    for start_n in range(0, n_events, PER_APPEND):
        nums = range(start_n + 1, min(start_n + PER_APPEND, n_events) + 1)
        payloads = [
            orjson.dumps({
                "message": f"GET /users/{i} HTTP/1.1 200 {i % 97} ms cache=miss upstream=app-{i % 7}",
                "@timestamp": f"2024-05-01T12:{i % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
                "host": "web-3", "level": "info", "request_id": f"{i:032x}",
            })
            for i in nums
        ]
        out.append(client.append(writer, payloads, nums[-1], len(out) + 1, split_at=sum(len(p) + 8 for p in payloads) - 77))
    return out


def decode_only(setup: bytes, appends: list[bytes], map_events: bool = False) -> float:
    data = setup + b"".join(appends)
    mapper = EventMapper(app_env="bench-segment", topic="logs.segment")
    server = wire.SegmentServer()
    events = 0
    t0 = time.perf_counter()
    for i in range(0, len(data), 65536):
        for req in server.feed(data[i : i + 65536]):
            if isinstance(req, wire.Append):
                events += req.num_events
                if map_events:
                    base = {"protocol": "segment", "peer": "127.0.0.1:1", "received_at": 0}
                    out = mapper.batches()
                    offsets = list(req.event_offsets)
                    positions = Positions("event_number", range(len(offsets)), "segment_offset", offsets,
                                          f"segment:x:{req.segment}@", offsets)
                    mapper.add_payloads(out, req.payloads, {**base, "segment": req.segment, "writer_id": str(req.writer_id)},
                                        positions)
    return events / (time.perf_counter() - t0)


def through_bridge(port: int, writer: uuid.UUID, appends: list[bytes], n_events: int) -> float:
    with SegmentTestClient(port, timeout=60) as c:
        c.hello()
        assert isinstance(c.create_segment(SEGMENT), (wire.SegmentCreated, wire.SegmentAlreadyExists))
        setup = c.setup_append(writer, SEGMENT)
        assert isinstance(setup, wire.AppendSetup), setup
        t0 = time.perf_counter()
        sent = outstanding = 0
        last = 0
        while last < n_events:
            while sent < len(appends) and outstanding < DEPTH:
                c.send_raw(appends[sent])
                sent += 1
                outstanding += 1
            ack = c.expect(wire.DataAppended)
            outstanding -= 1
            last = ack.event_number
        return n_events / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    run = Run("segment")
    writer = uuid.uuid4()
    appends = make_appends(args.events, writer)
    setup = wire.SegmentClient().send(wire.SetupAppend(1, writer, SEGMENT, ""))
    size = sum(len(a) for a in appends) / args.events

    reference = max(decode_only(setup, appends) for _ in range(args.rounds))
    mapped = max(decode_only(setup, appends, map_events=True) for _ in range(args.rounds))

    dev = start_device()
    data_dir = Path(tempfile.mkdtemp(prefix="segment-bench-"))
    port = free_port()
    bridge = start([
        command("logjam-bridge"), "segment", "--listen", f"127.0.0.1:{port}", "--device", dev.router,
        "--app-env", "bench-segment", "--data-dir", str(data_dir), "--plaintext",  # start_device: no CURVE
    ])
    try:
        wait_for(lambda: port_open(port), timeout=20, what="the bridge")
        bridged = through_bridge(port, writer, appends, args.events)
        server = wire.SegmentServer()
        bodies = [p for req in server.feed(setup + b"".join(appends)) if isinstance(req, wire.Append) for p in req.payloads]
        ceiling = max(device_ceiling(dev.router, bodies, app_env="bench-segment") for _ in range(2))
    finally:
        stop(bridge)
        stop(dev.proc)
        shutil.rmtree(data_dir, ignore_errors=True)

    ratio = bridged / reference
    print(f"segment bridge: {args.events:,} events of ~{size:.0f} B on the wire, appends of {PER_APPEND}, {DEPTH} in flight")
    print(f"  through bridge + device (fsync always): {bridged:12,.0f} events/s")
    print(f"  decode-only (engine, in-process):       {reference:12,.0f} events/s")
    print(f"  decode + map to Logjam (in-process):    {mapped:12,.0f} events/s")
    print(f"  ratio: {ratio:.2f}x (target >= {run.target('ratio'):g}x); bridge / decode+map: {bridged / mapped:.2f}x")
    print(f"  {describe(ceiling, reference)}")
    run.figure("through bridge + device (fsync always)", bridged, "events/s")
    run.figure("decode-only (engine, in-process)", reference, "events/s")
    run.figure("decode + map to Logjam (in-process)", mapped, "events/s")
    run.figure("device ceiling", ceiling, "events/s")
    run.check("ratio", ratio)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
