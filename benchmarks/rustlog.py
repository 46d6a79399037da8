"""RustLog bridge throughput: produce through bridge + device, and fetch, against decode-only.

Starts a real `logjam-device` and `logjam-bridge rustlog` (fsync always, the default)
on free ports, then:
- produce: batches of 1000 records of 200 B, in the binary dialect (the reference
  broker's) and in JSON, from two connections on two partitions; a batch counts
  when its ProduceResponse arrived, i.e. after the log append, the fsync and the
  device's 202 for all 1000 records;
- fetch: everything back with max_bytes 1 MiB;
- the reference, measured in the same run: the sans-IO engine decoding the same
  produce frames in-process (no log, no device, no sockets).
Prints records/s and the ratio produce / decode-only per dialect, against its target
(benchmarks/targets.toml).

RUSTLOG_BENCH_BATCHES sets batches per connection (default 25);
RUSTLOG_BENCH_BRIDGE_CMD replaces the bridge command (to try variants).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.device_ceiling import describe, device_ceiling  # noqa: E402
from bridges.rustlog import engine as e  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from harness.cpu import cpu_seconds  # noqa: E402

BIN = Path(sys.executable).parent
RECORDS, RECORD_SIZE = 1000, 200
BATCHES_PER_CONN = int(os.environ.get("RUSTLOG_BENCH_BATCHES", "25"))
CONNS = 2
BRIDGE_CMD = os.environ.get("RUSTLOG_BENCH_BRIDGE_CMD", str(BIN / "logjam-bridge")).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def records(seed: int) -> tuple[bytes, ...]:
    base = b'{"level":"info","msg":"GET /orders ok","host":"web%02d","n":%d,"pad":"'
    out = []
    for i in range(RECORDS):
        head = base % (seed % 100, i)
        out.append(head + b"x" * (RECORD_SIZE - len(head) - 2) + b'"}')
    return tuple(out)


def frames(dialect: e.Dialect, partition: int) -> list[bytes]:
    client = e.RustlogClient()
    return [client.send(e.Produce("bench", partition, records(k), dialect)) for k in range(BATCHES_PER_CONN)]


def decode_only(all_frames: list[bytes]) -> tuple[float, float]:
    """Records per second and per CPU-second of RustlogServer.feed on the same frames
    (fed in 64 KiB reads), best of 3."""
    best = best_cpu = 0.0
    for _ in range(3):
        server = e.RustlogServer()
        n = 0
        start, cpu = time.perf_counter(), time.process_time()
        for f in all_frames:
            for i in range(0, len(f), 65536):
                for ev in server.feed(f[i:i + 65536]):
                    n += len(ev.records)
        best = max(best, n / (time.perf_counter() - start))
        best_cpu = max(best_cpu, n / max(time.process_time() - cpu, 1e-9))
    return best, best_cpu


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.engine = e.RustlogClient()
        self.pending: list = []

    def call(self, request: e.Request):
        self.sock.sendall(self.engine.send(request))
        return self.recv()

    def recv(self):
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("bridge closed the connection")
            self.pending += self.engine.feed(data)
        return self.pending.pop(0)


def produce_run(port: int, conn_frames: list[list[bytes]]) -> float:
    clients = [Client(port) for _ in conn_frames]
    errors: list[object] = []

    def run(client: Client, fs: list[bytes]) -> None:
        # Two requests in flight per connection: the bridge reads the next while answering one.
        inflight = 0
        for f in fs:
            client.sock.sendall(f)
            inflight += 1
            if inflight == 2:
                resp = client.recv()
                inflight -= 1
                if not isinstance(resp, e.ProduceResponse):
                    errors.append(resp)
        for _ in range(inflight):
            resp = client.recv()
            if not isinstance(resp, e.ProduceResponse):
                errors.append(resp)

    threads = [threading.Thread(target=run, args=(c, fs)) for c, fs in zip(clients, conn_frames)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for c in clients:
        c.sock.close()
    if errors:
        raise SystemExit(f"produce failed: {errors[0]}")
    return sum(len(fs) for fs in conn_frames) * RECORDS / elapsed


def fetch_run(port: int, dialect: e.Dialect, partitions: int) -> tuple[float, float]:
    client = Client(port)
    n = nbytes = 0
    start = time.perf_counter()
    for p in range(partitions):
        offset = 0
        while True:
            resp = client.call(e.Fetch("bench", p, offset, 1 << 20, "", dialect))
            assert isinstance(resp, e.FetchResponse), resp
            if not resp.records:
                break
            n += len(resp.records)
            nbytes += sum(len(r.payload) for r in resp.records)
            offset += len(resp.records)
    elapsed = time.perf_counter() - start
    client.sock.close()
    return n / elapsed, nbytes / elapsed / 1e6


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # run the cleanup below: never leave a device or bridge behind


def main() -> int:
    signal.signal(signal.SIGTERM, _terminate)
    run = Run("rustlog")
    tmp = Path(tempfile.mkdtemp(prefix="rustlog-bench-"))
    ports = {k: free_port() for k in ("router", "pull", "pub", "stats", "bridge")}
    device = subprocess.Popen(
        [str(BIN / "logjam-device"), "--bind", "127.0.0.1", "-t", str(ports["router"]), "-p", str(ports["pull"]),
         "-P", str(ports["pub"]), "-s", str(ports["stats"]), "-d", "1", "--allow-plaintext"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    bridge = None
    try:
        wait_port(ports["router"], device)
        bridge = subprocess.Popen(
            [*BRIDGE_CMD, "rustlog", "--listen", f"127.0.0.1:{ports['bridge']}",
             "--device", f"tcp://127.0.0.1:{ports['router']}", "--app-env", "bench-rustlog",
             "--data-dir", str(tmp / "data"), "--plaintext"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(ports["bridge"], bridge)
        admin = Client(ports["bridge"])
        assert isinstance(admin.call(e.CreateTopic("bench", 2 * CONNS, e.Dialect.JSON)), e.CreateTopicResponse)
        admin.sock.close()

        print(f"RustLog bridge: batches of {RECORDS} x {RECORD_SIZE} B records, {CONNS} connections x {BATCHES_PER_CONN} batches, fsync always")
        ratios = []
        for k, dialect in enumerate((e.Dialect.BINARY, e.Dialect.JSON)):
            conn_frames = [frames(dialect, k * CONNS + c) for c in range(CONNS)]
            # Warm up the whole path once (imports, sockets, page cache) on a throwaway batch.
            produce_run(ports["bridge"], [[conn_frames[0][0]]])
            limit, limit_cpu = decode_only([f for fs in conn_frames for f in fs])
            cpu0 = cpu_seconds(bridge.pid), cpu_seconds(device.pid)
            rate = produce_run(ports["bridge"], conn_frames)
            bridge_cpu = cpu_seconds(bridge.pid) - cpu0[0]
            device_cpu = cpu_seconds(device.pid) - cpu0[1]
            n = CONNS * BATCHES_PER_CONN * RECORDS
            per_cpu = n / max(bridge_cpu + device_cpu, 1e-9)
            ratio = rate / limit
            ratios.append(ratio)
            print(f"  {dialect.value:6s} decode-only (reference): {limit:>10,.0f} records/s   {limit_cpu:>10,.0f} records/CPU-s")
            print(f"  {dialect.value:6s} produce bridge+device  : {rate:>10,.0f} records/s   {per_cpu:>10,.0f} records/CPU-s"
                  f" (bridge {bridge_cpu:.1f} s, device {device_cpu:.1f} s)")
            print(f"  {dialect.value:6s} ratio produce/decode   : {ratio:.3f}x wall, {per_cpu / limit_cpu:.3f}x per CPU-s "
                  f"(target >= {run.target('produce_ratio'):g}x)")
            run.check("produce_ratio", ratio, dialect.value)
            run.figure(f"{dialect.value}: decode-only", limit, "records/s")
            run.figure(f"{dialect.value}: produce through bridge + device", rate, "records/s")
            bodies = [r for k in range(BATCHES_PER_CONN) for r in records(k)] * CONNS
            ceiling = max(device_ceiling(f"tcp://127.0.0.1:{ports['router']}", bodies, app_env="bench-rustlog")
                          for _ in range(2))
            print(f"  {dialect.value:6s} {describe(ceiling, limit)}")
            run.figure(f"{dialect.value}: device ceiling", ceiling, "records/s")
        for dialect in (e.Dialect.BINARY, e.Dialect.JSON):
            recs, mb = fetch_run(ports["bridge"], dialect, 2 * CONNS)
            print(f"  {dialect.value:6s} fetch                  : {recs:>10,.0f} records/s   {mb:.1f} MB/s of payload")
            run.figure(f"{dialect.value}: fetch", recs, "records/s")
        run.save()
        return 0
    finally:
        for proc in (bridge, device):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
