"""Benchmark: Lumberjack events/s through `logjam-bridge lumberjack` + `logjam-device`.

The wire bytes are built with pylogbeat's own encoder (v2, one W then one C frame of J
frames per window, 2048 events of ~200 bytes each, zlib at its default level), so they
are exactly what pylogbeat sends. One TCP client writes them with two windows in flight
(Filebeat's pipelining; pylogbeat itself waits for each ack) and checks every ack; a
subscriber on the device counts the messages. The clock stops when the subscriber has
counted every event and the last ack arrived.

The reference, measured in the same run on the same bytes, is the in-process
decode-only limit: the sans-IO engine fed 64 KiB reads (zlib inflate + frame parse,
with the same C header scan the bridge uses) plus orjson parsing each event, with no
sockets, mapping or device.

A second phase pauses the device (SIGSTOP) while 10 clients send without waiting for
acks, and reports the bridge's peak RSS: back-pressure must stop reading, not buffer.

Run: .venv/bin/python benchmarks/lumberjack.py [--windows N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import pylogbeat  # noqa: E402

from bridges.lumberjack.engine import JsonFrames, LumberjackClient, LumberjackServer  # noqa: E402
from benchmarks.device_ceiling import Counter, counting_sub, describe, device_ceiling  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from harness.cpu import cpu_seconds  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402

WINDOW = 2048
APP_ENV = "lumberjack-bench"


def make_event(rnd: random.Random, w: int, i: int) -> dict:
    return {
        "@timestamp": f"2024-05-01T12:{w % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        "message": f"GET /api/v1/users/{rnd.randrange(10**6)}/orders HTTP/1.1 200 "
                   f"{rnd.random() * 200:.1f}ms req={rnd.getrandbits(64):016x}",
        "host": {"name": "web-17.example.net"}, "log": {"offset": (w * WINDOW + i) * 120},
        "service": "shop",
    }


def make_event_sample() -> dict:
    return make_event(random.Random(0), 0, 0)


def make_windows(n: int) -> list[bytes]:
    """n windows of WINDOW events, encoded by pylogbeat (seqs count across windows)."""
    client = pylogbeat.PyLogBeatClient("127.0.0.1", 0)
    rnd = random.Random(42)  # request ids and timings vary, as in real logs
    windows = []
    for w in range(n):
        events = [make_event(rnd, w, i) for i in range(WINDOW)]
        client._window_size = len(events)
        header = struct.pack(">BBI", pylogbeat.PROTOCOL_VERSION, pylogbeat.FRAME_TYPE_WINDOW_SIZE, len(events))
        windows.append(header + client._compress_payload(client._factor_payload(events)))
    return windows


def decode_only(windows: list[bytes]) -> tuple[float, float]:
    """(events per wall second, events per CPU second) of the engine + orjson alone."""
    wire = b"".join(windows)
    engine = LumberjackServer()
    loads = orjson.loads
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(wire), 65536):
        for ev in engine.feed(wire[i : i + 65536]):
            if type(ev) is JsonFrames:
                data = ev.data
                for start, size in zip(ev.offsets, ev.lengths):
                    loads(data[start : start + size])
                n += len(ev)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert n == len(windows) * WINDOW, n
    return n / elapsed, n / max(cpu, 1e-9)


def through_bridge(dev, port: int, windows: list[bytes]) -> float:
    total = len(windows) * WINDOW
    sub = counting_sub(dev.router, dev.pub, APP_ENV)
    counter = Counter(sub, total)
    acks = LumberjackClient()  # only its ack parser is used
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    last_seq = [w * WINDOW + WINDOW for w in range(len(windows))]
    acked = 0
    t0 = time.perf_counter()
    sent = 0
    while acked < last_seq[-1]:
        # Two windows in flight, as Filebeat pipelines.
        while sent < len(windows) and (sent == 0 or acked >= last_seq[sent - 1] - WINDOW):
            sock.sendall(windows[sent])
            sent += 1
        data = sock.recv(65536)
        if not data:
            raise SystemExit("bridge closed the connection")
        for ack in acks.feed(data):
            acked = max(acked, ack.seq)
    t_acked = time.perf_counter()
    counter.join(60)
    sock.close()
    sub.close()
    if counter.done_at is None:
        raise SystemExit(f"subscriber counted {counter.counted} of {total}")
    return total / (max(counter.done_at, t_acked) - t0)


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1])
    return out


def paused_rss(dev, bridge_pid: int, port: int, windows: list[bytes], clients: int = 10) -> tuple[dict, dict, int]:
    before = rss_kib(bridge_pid)
    os.kill(dev.proc.pid, signal.SIGSTOP)
    sent = [0] * clients
    last = [time.monotonic()] * clients
    stop_flag = threading.Event()

    def pump(k: int) -> None:
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(0.2)
        try:
            for i in range(10**9):
                view = memoryview(windows[i % len(windows)])
                while view:
                    if stop_flag.is_set():
                        return
                    try:
                        view = view[s.send(view):]
                        last[k] = time.monotonic()
                    except (TimeoutError, BlockingIOError):
                        continue
                sent[k] += 1
        finally:
            s.close()

    threads = [threading.Thread(target=pump, args=(k,), daemon=True) for k in range(clients)]
    try:
        for t in threads:
            t.start()
        # Every sender is blocked by back-pressure once none made progress for 2 s.
        wait_for(lambda: time.monotonic() - max(last) > 2.0, timeout=25, interval=0.1, what="senders to block")
        during = rss_kib(bridge_pid)
    finally:
        stop_flag.set()
        os.kill(dev.proc.pid, signal.SIGCONT)
        for t in threads:
            t.join(5)
    return before, during, sum(sent)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=12, help="2048-event windows per round (default 12)")
    ap.add_argument("--rounds", type=int, default=2, help="best of this many rounds (default 2)")
    ap.add_argument("--bridge-flag", action="append", default=[], help="extra flag for logjam-bridge (repeatable)")
    args = ap.parse_args()
    run = Run("lumberjack")

    windows = make_windows(args.windows)
    size = sum(len(w) for w in windows) / (args.windows * WINDOW)
    refs = [decode_only(windows) for _ in range(3)]
    ref = max(r[0] for r in refs)
    ref_cpu = max(r[1] for r in refs)

    dev = start_device(device_id=7)
    port = free_port()
    log_file = tempfile.NamedTemporaryFile("w+", prefix="lumberjack-bench-", suffix=".log")
    bridge = subprocess.Popen(
        [command("logjam-bridge"), "lumberjack", "--listen", f"127.0.0.1:{port}", "--device", dev.router,
         "--app-env", APP_ENV, "--plaintext", *args.bridge_flag],  # start_device runs without CURVE
        stdout=log_file, stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: port_open(port), timeout=20, what="bridge to listen")
        cpu0 = cpu_seconds(bridge.pid), cpu_seconds(dev.proc.pid), time.process_time()
        rates = [through_bridge(dev, port, windows) for _ in range(args.rounds)]
        cpu1 = cpu_seconds(bridge.pid), cpu_seconds(dev.proc.pid), time.process_time()
        bodies = [orjson.dumps(make_event(random.Random(i), 0, i)) for i in range(args.windows * WINDOW)]
        ceil0 = time.process_time()
        ceiling = max(device_ceiling(dev.router, bodies, app_env=APP_ENV, pub=dev.pub) for _ in range(2))
        # This process's CPU per event in the ceiling runs: the free producer plus the subscriber.
        ceiling_self_us = (time.process_time() - ceil0) / (2 * len(bodies)) * 1e6
        e2e = max(rates)
        events = args.rounds * args.windows * WINDOW
        per_cpu = [events / max(b - a, 1e-9) for a, b in zip(cpu0, cpu1)]
        busy = sum(b - a for a, b in zip(cpu0, cpu1)) / sum(args.windows * WINDOW / r for r in rates)
        before, during, blocked_windows = paused_rss(dev, bridge.pid, port, windows)
    finally:
        code = stop(bridge)
        stop(dev.proc)
        if code != 0:
            log_file.seek(0)
            print(log_file.read()[-4000:], file=sys.stderr)
            raise SystemExit(f"logjam-bridge exited {code}")

    raw = len(orjson.dumps(make_event_sample()))
    print(f"events: {args.windows} windows x {WINDOW} (pylogbeat framing, v2, C frames), "
          f"~{raw} bytes of JSON each, {size:.0f} bytes/event on the wire")
    print(f"decode-only limit (inflate + frame parse + JSON parse): {ref:12,.0f} events/s")
    print(f"bridge + device + subscriber:                           {e2e:12,.0f} events/s  (rounds: "
          + ", ".join(f"{r:,.0f}" for r in rates) + ")")
    print(f"ratio: {e2e / ref:.2f}x (target >= {run.target('ratio'):g}x)")
    print(describe(ceiling, ref, "device + subscriber"))
    print(f"CPU cost (load-independent): bridge {per_cpu[0]:,.0f} events per CPU-second, "
          f"device {per_cpu[1]:,.0f}, decode-only {ref_cpu:,.0f}; bridge/decode-only {per_cpu[0] / ref_cpu:.2f}x")
    # Every process of the pipeline shares this machine's cores, so their CPU per event,
    # summed, bounds the rate: cores / (bridge + device + client and subscriber).
    cores = os.cpu_count() or 1
    us = [1e6 / r for r in per_cpu]
    bound = cores / sum(1 / r for r in per_cpu)
    rest = cores / sum(1 / r for r in per_cpu[1:])
    print(f"CPU per event: bridge {us[0]:.2f} us, device {us[1]:.2f} us, this process's client + subscriber "
          f"{us[2]:.2f} us; {busy:.2f} of {cores} cores busy while events flowed")
    print(f"CPU bound on {cores} cores: at most {bound:,.0f} events/s = {bound / ref:.2f}x of decode-only; "
          f"with a bridge that cost nothing, at most {rest:,.0f} events/s = {rest / ref:.2f}x")
    # The free producer's sending is the part of a bridge's work no bridge can skip; the
    # subscriber's share is taken from the bridge rounds, where this process only counted.
    producer_us = max(0.0, ceiling_self_us - us[2])
    print(f"free producer in the ceiling runs: about {producer_us:.2f} us per event to send the requests and "
          f"read the replies; the bridge spends {us[0] - producer_us:.2f} us per event beyond that "
          f"(reading, inflating, validating and splicing, acks, Python)")
    print(f"device paused, 10 clients sending: bridge RSS {before['VmRSS'] / 1024:.1f} MiB before, "
          f"{during['VmRSS'] / 1024:.1f} MiB with every client blocked, peak (VmHWM) {during['VmHWM'] / 1024:.1f} MiB; "
          f"{blocked_windows} windows got out of the clients")
    run.figure("decode-only limit", ref, "events/s")
    run.figure("bridge + device + subscriber", e2e, "events/s")
    run.figure("device ceiling (device + subscriber)", ceiling, "events/s")
    run.figure("bridge CPU per event", us[0], "us")
    run.figure("device CPU per event", us[1], "us")
    run.figure("bridge RSS, device paused, every client blocked", during["VmRSS"] / 1024, "MiB")
    run.check("ratio", e2e / ref)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
