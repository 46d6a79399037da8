"""Benchmark: OTLP log records/s through `logjam-bridge otlp` + `logjam-device`, against Lumberjack.

The records are benchmarks/lumberjack.py's events (a ~120-byte message, a host, an offset,
a service) as OTLP log records as the SDKs send them: the message as the body, the host
name, offset and service as 3 attributes, a time, an observed time, a severity and a trace
context, under one resource of 15 attributes (service.name, deployment.environment.name
and what the SDKs add: telemetry.sdk.*, host.*, os.*, process.*, service.version, ...), 512
per request (the SDK's batch size). They go as OTLP/HTTP protobuf and OTLP/JSON
(`OtlpClient`, the engine's client half, over plain sockets; the JSON as the npm exporter
writes it: hex ids, int64 as strings) and as OTLP/gRPC (grpcio's own channel, the stack the
SDK exporter uses), from two clients each, every request waiting for its answer (the
exporters send one request at a time); a subscriber on the device counts the messages. The
clock stops when the subscriber counted every record and the last answer arrived.

References, measured in the same run: the mapping step alone (`records.encode` on the same
request bytes: parse and mapping to finished bodies, no sockets, no device; native/otlp_*.c
unless LOGJAM_NATIVE=off or it is not built, which the line says), and the Lumberjack bridge
with the same events (benchmarks/lumberjack.py's client and framing).
Prints records/s, the bridge's CPU per record against its target (benchmarks/targets.toml),
and the ratio to the Lumberjack bridge.

Run: .venv/bin/python benchmarks/otlp.py [--requests N] [--rounds R]
"""

from __future__ import annotations

import argparse
import base64
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
import orjson  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope  # noqa: E402
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs  # noqa: E402
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402

from benchmarks.device_ceiling import Counter, counting_sub  # noqa: E402
from benchmarks.lumberjack import WINDOW, make_event, make_windows, through_bridge  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from harness.cpu import cpu_seconds  # noqa: E402
from bridges.otlp import engine, records  # noqa: E402
from bridges.otlp.records import MODULE as OTLP_MODULE  # noqa: E402  (main's `records` is a count)
from bridges.host.mapping import parse_timestamp  # noqa: E402
from harness.device import start_device  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402
from logjam import native  # noqa: E402

PER_REQUEST = 512
CLIENTS = 2
RESOURCE = {  # 15 attributes, as an SDK's resource detectors fill it
    "service.name": "shop", "deployment.environment.name": "bench", "service.version": "2.14.1",
    "service.instance.id": "627cc493-f310-47de-96bd-71410b7dec09", "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.version": "1.45.2", "host.name": "web-17.example.net",
    "host.arch": "amd64", "os.type": "linux", "os.description": "Linux 6.8.0-45-generic", "process.pid": 48213,
    "process.executable.name": "python3", "process.runtime.name": "cpython", "process.runtime.version": "3.12.7",
}
RECORD_ATTRIBUTES = 3  # host.name, log.offset, service
APP_ENV = "shop-bench"
METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def _record(event: dict, trace: bytes, span: bytes, observed_ns: int) -> LogRecord:
    return LogRecord(
        time_unix_nano=parse_timestamp(event["@timestamp"]) * 1_000_000, observed_time_unix_nano=observed_ns,
        severity_number=9, severity_text="INFO", body=AnyValue(string_value=event["message"]),
        attributes=engine.to_attributes({"host.name": event["host"]["name"], "log.offset": event["log"]["offset"],
                                         "service": event["service"]}),
        trace_id=trace, span_id=span, flags=1)


def make_requests(n: int, salt: int = 0, *, json: bool = False) -> list[bytes]:
    """n ExportLogsServiceRequests of PER_REQUEST records each (the events of benchmarks/lumberjack.py),
    protobuf or OTLP/JSON. Each round sends other bytes (`salt` moves the observed time): the
    bridge answers a request it accepted moments ago from its memory of request digests,
    without publishing it again."""
    rnd = random.Random(42)
    out = []
    for r in range(n):
        observed = 1_700_000_000_000_000_000 + salt * 1_000_000 + r
        recs = [_record(make_event(rnd, r, i), rnd.randbytes(16), rnd.randbytes(8), observed) for i in range(PER_REQUEST)]
        request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
            resource=Resource(attributes=engine.to_attributes(RESOURCE)),
            scope_logs=[ScopeLogs(scope=InstrumentationScope(name="shop.orders", version="1.0"), log_records=recs)])])
        out.append(_otlp_json(request) if json else request.SerializeToString())
    return out


def _otlp_json(request: ExportLogsServiceRequest) -> bytes:
    """OTLP/JSON as the npm exporter writes it: protobuf's JSON with hex ids (int64 already strings)."""
    doc = json_format.MessageToDict(request)
    for rl in doc["resourceLogs"]:
        for sl in rl["scopeLogs"]:
            for rec in sl["logRecords"]:
                for name in ("traceId", "spanId"):
                    rec[name] = base64.b64decode(rec[name]).hex()
    return orjson.dumps(doc)


def decode_only(requests: list[bytes], json: bool = False) -> float:
    """Records per CPU second of the mapping step alone (parse, map, finished bodies)."""
    c0 = time.process_time()
    n = sum(len(res.lens) for body in requests
            for res in records.encode(body, json=json, key="k", metadata={"transport": "bench"}))
    return n / max(time.process_time() - c0, 1e-9)


def _http_client(port: int, requests: list[bytes], errors: list[str], json: bool = False) -> None:
    client = engine.OtlpClient("127.0.0.1", json=json)
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
    target = _grpc_client if transport == "grpc" else _http_client
    shares = [requests[k::CLIENTS] for k in range(CLIENTS)]
    threads = [threading.Thread(target=target, args=(port, share, errors) + ((True,) if transport == "json" else ()))
               for share in shares]
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
    run = Run("otlp")
    targets = {f"otlp {t}": run.target(f"bridge_cpu_us_{t}") for t in ("http", "grpc", "json")}  # us per record
    requests = make_requests(args.requests)
    json_requests = make_requests(args.requests, json=True)
    records = args.requests * PER_REQUEST
    ref_cpu = max(decode_only(requests) for _ in range(3))
    ref_json = max(decode_only(json_requests, True) for _ in range(3))

    dev = start_device(device_id=7)
    http_port, grpc_port, lj_port = free_port(), free_port(), free_port()
    results: dict[str, tuple[float, float]] = {}  # name -> (records/s, bridge CPU us per record)
    try:
        otlp, otlp_log = run_bridge([command("logjam-bridge"), "otlp", "--listen", f"127.0.0.1:{http_port}",
                                     "--grpc-listen", f"127.0.0.1:{grpc_port}", "--device", dev.router,
                                     "--plaintext"], http_port)
        try:
            for k, (transport, port) in enumerate((("http", http_port), ("grpc", grpc_port), ("json", http_port))):
                rounds = [make_requests(args.requests, 1 + k * args.rounds + r, json=transport == "json")
                          for r in range(args.rounds)]
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
    json_size = sum(map(len, json_requests)) / records
    print(f"records: {args.requests} requests x {PER_REQUEST} (benchmarks/lumberjack.py's events as OTLP log "
          f"records), {len(RESOURCE)} resource attributes, {RECORD_ATTRIBUTES} record attributes; {size:.0f} bytes/record "
          f"of protobuf, {json_size:.0f} of OTLP/JSON; {CLIENTS} clients per transport, one request at a time each, "
          f"{args.rounds} rounds")
    path = "C, native/otlp_*.c" if native.load(OTLP_MODULE) is not None else "Python"
    print(f"mapping step alone ({path}: parse + map + encode), protobuf: {ref_cpu:10,.0f} records per CPU-second "
          f"({1e6 / ref_cpu:.2f} us per record); OTLP/JSON: {ref_json:10,.0f} ({1e6 / ref_json:.2f} us per record)")
    lj_rate, lj_us = results["lumberjack"]
    for name, (rate, us) in results.items():
        target = targets.get(name)
        verdict = "" if target is None else f" (target <= {target:g}: {'met' if us <= target else 'NOT met'})"
        print(f"{name:<11} bridge + device + subscriber: {rate:10,.0f} records/s, bridge CPU {us:6.2f} us per record"
              + verdict + ("" if name == "lumberjack" else f"; {rate / lj_rate:.2f}x the Lumberjack bridge's rate, "
                           f"{us / lj_us:.2f}x its CPU per record"))
        run.figure(f"{name}: bridge + device + subscriber", rate, "records/s")
        if target is None:
            run.figure(f"{name}: bridge CPU per record", us, "us")
        else:
            run.check(f"bridge_cpu_us_{name.split()[1]}", us)
    run.figure("mapping step alone, protobuf", 1e6 / ref_cpu, "us/record")
    run.figure("mapping step alone, OTLP/JSON", 1e6 / ref_json, "us/record")
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
