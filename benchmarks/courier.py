"""Benchmark: Log Courier events/s through `logjam-bridge courier` + `logjam-device`.

The client sends 1024-event JDAT payloads pipelined (with the spec-following test
client, which checks every ACKN) and the clock stops at the last payload's final
ACKN, i.e. when the device has accepted every event. The reference, measured in the
same run on the same bytes, is the in-process decode-only limit: the sans-IO engine
inflating and parsing the payloads with no sockets, mapping or device. Prints both
rates and the ratio, against its target (benchmarks/targets.toml).

Run: .venv/bin/python benchmarks/courier.py [--payloads N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402

from bridges.courier.engine import CourierServer  # noqa: E402
from bridges.courier.messages import EventReceived  # noqa: E402
from bridges.courier.wire import encode_jdat  # noqa: E402
from benchmarks.device_ceiling import describe, device_ceiling  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.courier_client import TestCourierClient  # noqa: E402
from harness.processes import command, free_port, port_open, start, stop, wait_for  # noqa: E402
from benchmarks.results import Run  # noqa: E402

PER_PAYLOAD = 1024


def make_events(p: int) -> list[bytes]:
    """The JSON events of payload p: typical shipper events, ~230 bytes each."""
    return [
        orjson.dumps({
            "message": f"GET /users/{p * PER_PAYLOAD + i} HTTP/1.1 200 {i % 97} ms cache=miss",
            "@timestamp": f"2024-05-01T12:{p % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
            "host": "web-17.example.net", "path": "/var/log/nginx/access.log",
            "offset": (p * PER_PAYLOAD + i) * 120, "timezone": "UTC", "tags": ["nginx", "prod"],
        })
        for i in range(PER_PAYLOAD)
    ]


def make_payloads(n: int) -> list[tuple[bytes, bytes]]:
    """(nonce, JDAT bytes) for n payloads of PER_PAYLOAD events."""
    out = []
    for p in range(n):
        nonce = os.urandom(16)
        out.append((nonce, encode_jdat(nonce, make_events(p))))
    return out


def decode_only(payloads: list[tuple[bytes, bytes]]) -> float:
    """Events/s of the engine alone, fed in 64 KiB reads like the bridge."""
    wire = b"".join(w for _, w in payloads)
    engine = CourierServer()
    n = 0
    start_t = time.perf_counter()
    for i in range(0, len(wire), 65536):
        events = engine.feed(wire[i : i + 65536])
        while events:  # the engine contract: feed(b"") until the read is used up, as the bridge does
            for ev in events:
                if type(ev) is EventReceived:
                    n += 1
            events = engine.feed(b"")
    elapsed = time.perf_counter() - start_t
    assert n == len(payloads) * PER_PAYLOAD
    return n / elapsed


def through_bridge(port: int, payloads: list[tuple[bytes, bytes]]) -> float:
    with TestCourierClient(port) as client:
        start_t = time.perf_counter()
        for nonce, wire in payloads:
            client.send_encoded(nonce, PER_PAYLOAD, wire)
        client.wait_all_acked(120)
        elapsed = time.perf_counter() - start_t
        assert len(client.done) == len(payloads)
    return len(payloads) * PER_PAYLOAD / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payloads", type=int, default=40, help="1024-event payloads per round (default 40)")
    ap.add_argument("--rounds", type=int, default=3, help="best of this many rounds (default 3)")
    args = ap.parse_args()
    run = Run("courier")

    payloads = make_payloads(args.payloads)
    device = start_device()
    port = free_port()
    bridge = start([
        command("logjam-bridge"), "courier", "--listen", f"127.0.0.1:{port}",
        "--device", device.router, "--app-env", "courier-bench", "--plaintext",  # start_device: no CURVE
    ])
    try:
        wait_for(lambda: port_open(port), timeout=20, what="the bridge to listen")
        through_bridge(port, payloads[:4])  # warm-up: connections, imports, allocator
        reference = max(decode_only(payloads) for _ in range(args.rounds))
        bridged = max(through_bridge(port, payloads) for _ in range(args.rounds))
        bodies = [e for p in range(args.payloads) for e in make_events(p)]
        ceiling = max(device_ceiling(device.router, bodies, app_env="courier-bench") for _ in range(2))
    finally:
        code = stop(bridge)
        stop(device.proc)
    ratio = bridged / reference
    print(f"courier: {args.payloads} x {PER_PAYLOAD}-event JDAT payloads, best of {args.rounds}")
    print(f"  decode-only (engine, in-process): {reference:12,.0f} events/s")
    print(f"  bridge + device, acked:           {bridged:12,.0f} events/s")
    print(f"  ratio: {ratio:.2f}x (target >= {run.target('ratio'):g}x)")
    print(f"  {describe(ceiling, reference)}")
    run.figure("decode-only (engine, in-process)", reference, "events/s")
    run.figure("bridge + device, acked", bridged, "events/s")
    run.figure("device ceiling", ceiling, "events/s")
    run.check("ratio", ratio)
    if code != 0:
        print(f"logjam-bridge exited {code}", file=sys.stderr)
        return 1
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
