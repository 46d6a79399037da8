"""Benchmark: OTLP log records/s through `logjam-bridge otlp` + `logjam-device`, against Lumberjack.

The records are benchmarks/lumberjack.py's events (a ~120-byte message, a host, an offset,
a service) as OTLP log records: the message as the body, the rest as attributes, a time and
a trace context, under one resource (service.name, deployment.environment.name), 512 per
request (the SDK's batch size). They go as OTLP/HTTP protobuf (`OtlpClient`, the engine's
client half, over plain sockets) and as OTLP/gRPC (grpcio's own channel, the stack the SDK
exporter uses), from two clients each, every request waiting for its answer (the exporters
send one request at a time); a subscriber on the device counts the messages. The clock
stops when the subscriber counted every record and the last answer arrived.

References, measured in the same run: the decoding step alone (`engine.decode` on the same
request bytes: protobuf parse and mapping, no sockets, no device), and the Lumberjack
bridge with the same events (benchmarks/lumberjack.py's client and framing).
Prints records/s, the bridge's CPU per record, and the ratio to the Lumberjack bridge.

Run: .venv/bin/python benchmarks/otlp.py [--requests N] [--rounds R]
"""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from benchmarks.device_ceiling import Counter, counting_sub  # noqa: E402
from benchmarks.lumberjack import WINDOW, cpu_seconds, make_event, make_windows, through_bridge  # noqa: E402
from bridges.otlp import engine  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402

PER_REQUEST = 512
CLIENTS = 2
RESOURCE = {"service.name": "shop", "deployment.environment.name": "bench"}
APP_ENV = "shop-bench"
METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def make_requests(n: int, salt: int = 0) -> list[bytes]:
    """n ExportLogsServiceRequests of PER_REQUEST records each (the events of benchmarks/lumberjack.py).
    Each round sends other bytes (`salt` moves the observed time): the bridge answers a request
    it accepted moments ago from its memory of request digests, without publishing it again."""
    rnd = random.Random(42)
    out = []
    for r in range(n):
        events = [make_event(rnd, r, i) for i in range(PER_REQUEST)]
        out.append(engine.client_request(events, RESOURCE, 1_700_000_000_000_000_000 + salt * 1_000_000 + r))
    return out


def decode_only(requests: list[bytes]) -> float:
    """Records per CPU second of the decoding step alone."""
    c0 = time.process_time()
    n = sum(len(res.bodies) for body in requests for res in engine.decode(body))
    return n / max(time.process_time() - c0, 1e-9)


def _http_client(port: int, requests: list[bytes], errors: list[str]) -> None:
    client = engine.OtlpClient("127.0.0.1")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for body in requests:
            sock.sendall(client.send(body))
            replies: list[engine.HttpResponse] = []
            while not replies:
                data = sock.recv(65536)
                if not data:
                    errors.append("the bridge closed the connection")
                    return
                replies = client.feed(data)
            if replies[0].status != 200:
                errors.append(f"HTTP {replies[0].status}")


def _grpc_client(port: int, requests: list[bytes], errors: list[str]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(METHOD)
        for body in requests:
            try:
                export(body, timeout=30)
            except grpc.RpcError as e:
                errors.append(str(e.code()))


def through_otlp(dev, transport: str, port: int, requests: list[bytes]) -> float:
    total = len(requests) * PER_REQUEST
    sub = counting_sub(dev.router, dev.pub, APP_ENV)
    counter = Counter(sub, total)
    errors: list[str] = []
    target = _http_client if transport == "http" else _grpc_client
    shares = [requests[k::CLIENTS] for k in range(CLIENTS)]
    threads = [threading.Thread(target=target, args=(port, share, errors)) for share in shares]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_answered = time.perf_counter()
    counter.join(60)
    sub.close()
    if errors:
        raise SystemExit(f"{transport}: {len(errors)} requests failed, e.g. {errors[0]}")
    if counter.done_at is None:
        raise SystemExit(f"{transport}: subscriber counted {counter.counted} of {total}")
    return total / (max(counter.done_at, t_answered) - t0)


def run_bridge(argv: list[str], port: int) -> tuple[subprocess.Popen, object]:
    log = tempfile.NamedTemporaryFile("w+", prefix="otlp-bench-", suffix=".log")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: port_open(port), timeout=20, what=f"{argv[1]} bridge to listen")
    return proc, log


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=48, help=f"requests of {PER_REQUEST} records per round (default 48)")
    ap.add_argument("--rounds", type=int, default=2, help="best of this many rounds (default 2)")
    args = ap.parse_args()
    requests = make_requests(args.requests)
    records = args.requests * PER_REQUEST
    ref_cpu = max(decode_only(requests) for _ in range(3))

    dev = start_device(device_id=7)
    http_port, grpc_port, lj_port = free_port(), free_port(), free_port()
    results: dict[str, tuple[float, float]] = {}  # name -> (records/s, bridge CPU us per record)
    try:
        otlp, otlp_log = run_bridge([command("logjam-bridge"), "otlp", "--listen", f"127.0.0.1:{http_port}",
                                     "--grpc-listen", f"127.0.0.1:{grpc_port}", "--device", dev.router,
                                     "--plaintext"], http_port)
        try:
            for k, (transport, port) in enumerate((("http", http_port), ("grpc", grpc_port))):
                rounds = [make_requests(args.requests, 1 + k * args.rounds + r) for r in range(args.rounds)]
                cpu0 = cpu_seconds(otlp.pid)
                rates = [through_otlp(dev, transport, port, reqs) for reqs in rounds]
                us = (cpu_seconds(otlp.pid) - cpu0) / (args.rounds * records) * 1e6
                results[f"otlp {transport}"] = (max(rates), us)
        finally:
            stop(otlp)
        windows = make_windows(max(1, records // WINDOW))
        lj, lj_log = run_bridge([command("logjam-bridge"), "lumberjack", "--listen", f"127.0.0.1:{lj_port}",
                                 "--device", dev.router, "--app-env", "lumberjack-bench", "--plaintext"], lj_port)
        try:
            cpu0 = cpu_seconds(lj.pid)
            rates = [through_bridge(dev, lj_port, windows) for _ in range(args.rounds)]
            us = (cpu_seconds(lj.pid) - cpu0) / (args.rounds * len(windows) * WINDOW) * 1e6
            results["lumberjack"] = (max(rates), us)
        finally:
            stop(lj)
    finally:
        stop(dev.proc)

    size = sum(map(len, requests)) / records
    print(f"records: {args.requests} requests x {PER_REQUEST} (benchmarks/lumberjack.py's events as OTLP log "
          f"records), {size:.0f} bytes/record of protobuf; {CLIENTS} clients per transport, one request at a time each")
    print(f"decoding step alone (protobuf parse + mapping): {ref_cpu:12,.0f} records per CPU-second "
          f"({1e6 / ref_cpu:.2f} us per record)")
    lj_rate, lj_us = results["lumberjack"]
    for name, (rate, us) in results.items():
        print(f"{name:<11} bridge + device + subscriber: {rate:10,.0f} records/s, bridge CPU {us:6.2f} us per record"
              + ("" if name == "lumberjack" else f"; {rate / lj_rate:.2f}x the Lumberjack bridge's rate, "
                 f"{us / lj_us:.2f}x its CPU per record"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
