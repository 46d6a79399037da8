"""Benchmark: syslog events/s through `logjam-bridge syslog` (TCP in both framings, UDP and RELP) +
`logjam-device`, and its CPU per event against its targets and `logjam-bridge lumberjack`
carrying the same events.

The events are RFC 5424 lines as rsyslog's RSYSLOG_SyslogProtocol23Format writes them
(~150 bytes, structured data on every tenth). TCP, octet-counted and LF-framed: one client
writes them all; the clock stops when a subscriber on the device has counted every event.
UDP: one datagram per line, at most `UDP_WINDOW` datagrams ahead of the subscriber's count
(so the kernel's socket buffer does not drop them); datagrams still lost are reported and
the CPU is divided by the events that arrived. RELP: one client with 128 frames unanswered
(librelp's window), the clock stops at the last `rsp 200 OK` and the subscriber's count. The Lumberjack run sends the same lines, each as
`{"message": line}`, in 2048-event windows of the project's own client (zlib level 6),
through benchmarks/lumberjack.py's acked client, on the same device.

The reference, measured in the same run, is the in-process decode-only limit: the sans-IO
framing engine fed 64 KiB reads, then each run parsed and mapped into batches as the TCP
session does (`map_run`), with no sockets or device.
Prints ev/s and CPU per event for each bridge, each syslog transport's CPU per event against
its target (benchmarks/targets.toml), and the ratio syslog / lumberjack.

The bridges inherit LOGJAM_NATIVE: under `off` the syslog bridge runs its Python paths (the
parser and orjson for the bodies, one recvfrom per datagram) instead of native/syslog.c, which
is how the C was shown to pay end to end. The CPU is read in clock ticks (10 ms): the default
61,440 events make one tick 0.16 us per event.

Run: [LOGJAM_NATIVE=off] .venv/bin/python benchmarks/syslog.py [--events N]
"""

from __future__ import annotations

import argparse
import random
import socket
import threading
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bridges.lumberjack.engine import LumberjackClient  # noqa: E402
from bridges.syslog.engine import SyslogClient, SyslogServer  # noqa: E402
from bridges.host.mapping import EventMapper  # noqa: E402
from bridges.syslog.bridge import map_run  # noqa: E402
from bridges.syslog.encode import native as native_encoder  # noqa: E402
from bridges.syslog.relp import RelpClient, Response  # noqa: E402
from benchmarks.device_ceiling import Counter, counting_sub  # noqa: E402
from benchmarks.lumberjack import APP_ENV as LUMBERJACK_APP_ENV  # noqa: E402
from benchmarks.lumberjack import WINDOW, through_bridge  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from harness.cpu import cpu_seconds  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402
from logjam import native  # noqa: E402

APP_ENV = "syslog-bench"
RELP_WINDOW = 128
UDP_WINDOW = 2048


def make_lines(n: int) -> list[bytes]:
    rnd = random.Random(42)
    out = []
    for i in range(n):
        sd = b'[meta@32473 seq="%d" region="eu-1"]' % i if i % 10 == 0 else b"-"
        out.append(b"<134>1 2026-11-27T10:%02d:%02d.%06dZ web-17.example.net nginx %d - %b "
                   b"GET /api/v1/users/%d/orders HTTP/1.1 200 %.1fms req=%016x"
                   % (i // 60 % 60, i % 60, i % 10**6, 1000 + i % 7, sd, rnd.randrange(10**6),
                      rnd.random() * 200, rnd.getrandbits(64)))
    return out


def decode_only(wire: bytes, n: int) -> tuple[float, float]:
    """(events/s, events per CPU second) of the TCP session's own work: framing, then parse and
    mapping of each run (`map_run`) into batches of 256, in process."""
    engine = SyslogServer()
    mapper = EventMapper(app_env=APP_ENV, topic="logs.syslog")
    app_env = SimpleNamespace(environment=None, default=APP_ENV)  # what AppEnv is without --app-name-environment
    base = {"protocol": "syslog", "protocol_version": "rfc6587", "peer": "127.0.0.1:1", "received_at": 1}
    got = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(wire), 65536):
        events = engine.feed(wire[i:i + 65536])
        while events:
            for ev in events:
                common = {**base, "framing": ev.framing}
                for j in range(0, len(ev.raws), 256):
                    map_run(mapper, mapper.batches(), ev.raws[j:j + 256], common, 1, app_env)  # type: ignore[arg-type]
                got += len(ev.raws)
            events = engine.feed(b"")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert got == n, got
    return n / elapsed, n / max(cpu, 1e-9)


def over_tcp(dev, port: int, wire: bytes, n: int) -> float:
    sub = counting_sub(dev.router, dev.pub, APP_ENV)
    counter = Counter(sub, n)
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(wire)
        counter.join(120)
    sub.close()
    if counter.done_at is None:
        raise SystemExit(f"subscriber counted {counter.counted} of {n}")
    return n / (counter.done_at - t0)


class LiveCounter(threading.Thread):
    """Counts messages on a SUB in Python, with `counted` readable while it runs (UDP's pacing)."""

    def __init__(self, sub, n: int) -> None:
        super().__init__(daemon=True)
        self.sub, self.n = sub, n
        self.counted = 0
        self.last_at = time.perf_counter()
        self.start()

    def run(self) -> None:
        import zmq
        self.sub.setsockopt(zmq.RCVTIMEO, 3000)
        while self.counted < self.n:
            try:
                self.sub.recv_multipart()
            except zmq.Again:
                return
            self.counted += 1
            self.last_at = time.perf_counter()


def over_udp(dev, port: int, lines: list[bytes]) -> tuple[float, int]:
    """(events/s, events that arrived): datagrams at most UDP_WINDOW ahead of the count."""
    sub = counting_sub(dev.router, dev.pub, APP_ENV)
    counter = LiveCounter(sub, len(lines))
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", port))
        t0 = time.perf_counter()
        while sent < len(lines):
            if sent - counter.counted < UDP_WINDOW:
                for m in lines[sent:sent + 256]:
                    s.send(m)
                sent = min(sent + 256, len(lines))
            elif not counter.is_alive():
                break
            else:
                time.sleep(0.0005)
        counter.join(60)
    sub.close()
    if counter.counted < len(lines):
        print(f"UDP: {len(lines) - counter.counted} of {len(lines)} datagrams lost", file=sys.stderr)
    return counter.counted / (counter.last_at - t0), counter.counted


def over_relp(dev, port: int, lines: list[bytes]) -> float:
    sub = counting_sub(dev.router, dev.pub, APP_ENV)
    counter = Counter(sub, len(lines))
    client = RelpClient()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def read() -> None:
            for r in client.feed(s.recv(65536)):
                if isinstance(r, Response) and r.code != 200:
                    raise SystemExit(f"RELP rsp {r.code} {r.text}")

        s.sendall(client.send("open"))
        while client.unanswered:
            read()
        t0 = time.perf_counter()
        sent = 0
        while sent < len(lines) or client.unanswered:
            room = RELP_WINDOW - client.unanswered
            if room > 0 and sent < len(lines):
                chunk = lines[sent:sent + room]
                s.sendall(b"".join(client.send("syslog", m) for m in chunk))
                sent += len(chunk)
            read()
        t_acked = time.perf_counter()
    counter.join(60)
    sub.close()
    if counter.done_at is None:
        raise SystemExit(f"subscriber counted {counter.counted} of {len(lines)}")
    return len(lines) / (max(counter.done_at, t_acked) - t0)


def run_bridge(dev, protocol: str, flags: list[str], work, port: int | None = None) -> tuple[float, float]:
    """(events/s, bridge CPU µs per event) of `work(port)`, which returns events/s and the events it got through."""
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix=f"{protocol}-bench-", suffix=".log")
    bridge = subprocess.Popen([command("logjam-bridge"), protocol, "--listen", f"127.0.0.1:{port}", "--device",
                               dev.router, "--app-env", LUMBERJACK_APP_ENV if protocol == "lumberjack" else APP_ENV,
                               "--plaintext", *flags],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: port_open(port), timeout=20, what=f"{protocol} bridge to listen")
        cpu0 = cpu_seconds(bridge.pid)
        rate, n = work(port)
        cpu = cpu_seconds(bridge.pid) - cpu0
    finally:
        if stop(bridge) != 0:
            log.seek(0)
            print(log.read()[-4000:], file=sys.stderr)
            raise SystemExit(f"logjam-bridge {protocol} failed")
    return rate, cpu / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30 * WINDOW, help=f"events per run, a multiple of {WINDOW}")
    args = ap.parse_args()
    run = Run("syslog", variant="python" if native.mode() == "off" else None)
    n = args.events // WINDOW * WINDOW
    lines = make_lines(n)
    wire = b"".join(SyslogClient().send(m) for m in lines)
    wire_lf = b"".join(SyslogClient("lf").send(m) for m in lines)
    ref, ref_cpu = max(decode_only(wire, n) for _ in range(3))
    lj = LumberjackClient()
    windows = [lj.send([{"message": m.decode()} for m in lines[w:w + WINDOW]]) for w in range(0, n, WINDOW)]

    dev = start_device(device_id=7)
    try:
        tcp, tcp_us = run_bridge(dev, "syslog", [], lambda port: (over_tcp(dev, port, wire, n), n))
        lf, lf_us = run_bridge(dev, "syslog", [], lambda port: (over_tcp(dev, port, wire_lf, n), n))
        udp_port = free_port()
        udp, udp_us = run_bridge(dev, "syslog", ["--udp-listen", f"127.0.0.1:{udp_port}"],
                                 lambda port: over_udp(dev, udp_port, lines))
        relp, relp_us = run_bridge(dev, "syslog", ["--relp"], lambda port: (over_relp(dev, port, lines), n))
        lumber, lumber_us = run_bridge(dev, "lumberjack", [], lambda port: (through_bridge(dev, port, windows), n))
    finally:
        stop(dev.proc)
    print(f"events: {n} RFC 5424 lines, ~{len(wire) // n} bytes each on the wire (octet-counted); "
          f"syslog bodies written by {'native/syslog.c' if native_encoder() is not None else 'Python'} "
          f"(LOGJAM_NATIVE={native.mode()})")
    print(f"decode-only limit (framing + parse + mapping): {ref:12,.0f} events/s, {1e6 / ref_cpu:.2f} us CPU per event")
    print(f"syslog TCP, octet-counted (bridge + device + subscriber): {tcp:12,.0f} events/s, "
          f"bridge {tcp_us:.2f} us CPU per event")
    print(f"syslog TCP, LF-framed (bridge + device + subscriber):     {lf:12,.0f} events/s, "
          f"bridge {lf_us:.2f} us CPU per event")
    print(f"syslog UDP, {UDP_WINDOW} datagrams ahead of the subscriber:     {udp:12,.0f} events/s, "
          f"bridge {udp_us:.2f} us CPU per event")
    print(f"syslog RELP, 128 unanswered, rsp after the device's 202: {relp:12,.0f} events/s, "
          f"bridge {relp_us:.2f} us CPU per event")
    print(f"lumberjack, the same lines as {{\"message\": line}}, 2 windows in flight: {lumber:12,.0f} events/s, "
          f"bridge {lumber_us:.2f} us CPU per event")
    print(f"ratio to lumberjack: TCP {tcp / lumber:.2f}x ev/s, {tcp_us / lumber_us:.2f}x CPU per event; "
          f"RELP {relp / lumber:.2f}x ev/s, {relp_us / lumber_us:.2f}x CPU per event")
    for name, us in (("tcp", tcp_us), ("lf", lf_us), ("udp", udp_us), ("relp", relp_us)):
        target = run.target(f"bridge_cpu_us_{name}")
        verdict = "met" if us <= target else f"missed by {us - target:.2f} us"
        print(f"target {name:4s} <= {target:.1f} us CPU per event: {us:5.2f} us, {verdict}")
        run.check(f"bridge_cpu_us_{name}", us)
    for name, rate in (("tcp", tcp), ("lf", lf), ("udp", udp), ("relp", relp), ("lumberjack", lumber)):
        run.figure(f"{name}: bridge + device + subscriber", rate, "events/s")
    run.figure("lumberjack: bridge CPU per event", lumber_us, "us")
    run.figure("decode-only: CPU per event", 1e6 / ref_cpu, "us")
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
