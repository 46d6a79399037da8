"""Importer throughput against Spark's own write of the same rows, plus publish-to-visible latency.

One run, one `logjam-spark` server, two paths over the same M messages:
- reference: `spark.createDataFrame(<prebuilt Arrow table>).write.parquet(...)`, batch by
  batch (same batch size and partitioning as the importer), timed from first write to last commit;
- importer: a real `logjam-importer` subscribed to this script's PUB socket; timed from the
  first message published to the last row committed (its rows-written metric).
It prints both rows/s and the ratio importer/reference (target >= 0.8), then the latency
from a Producer's acknowledged publish through a real `logjam-device` until the row is
visible to `spark.read`. Usage: python benchmarks/importer.py [--messages M] [--spark sc://...]
[--event-ids] (every body gets a distinct `@metadata._id`, as bridges send them: the importer's
dedupe then looks up and remembers a key per message).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from importer.decode import BatchBuilder  # noqa: E402
from importer.paths import output_root  # noqa: E402
from importer.writer import write_batch  # noqa: E402
from logjam.message import Message  # noqa: E402
from logjam.meta import Compression  # noqa: E402
from logjam.producer import Producer  # noqa: E402
from tests.helpers import command, free_port, port_open, wait_for  # noqa: E402

BIN = Path(sys.executable).parent


def messages(n: int, event_ids: bool = False) -> list[Message]:
    rng = random.Random(5)
    streams = [f"app{i}-prod" for i in range(8)]
    actions = ["Users#show", "Orders#create", "Search#index", "Carts#update"]
    out = []
    for i in range(n):
        body = {"action": rng.choice(actions), "code": rng.choice([200, 200, 200, 302, 404, 500]),
                "total_time": rng.random() * 300, "request_id": f"{rng.getrandbits(64):016x}",
                "host": f"web{rng.randint(1, 20)}", "severity": 1, "message": "Completed " + "x" * rng.randint(20, 200),
                "@metadata": {"protocol": "logjam"}}
        if event_ids:
            body["@metadata"]["_id"] = f"bench-{rng.getrandbits(64):016x}:{i}"
        out.append(Message.build(streams[i % len(streams)], "logs.rails", body, compression=Compression.SNAPPY,
                                 seq=i + 1, device=9))
    return out


def metric(port: int, name: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=120_000)
    ap.add_argument("--batch-rows", type=int, default=40_000)
    ap.add_argument("--spark", help="use this running Spark Connect server instead of starting one")
    ap.add_argument("--event-ids", action="store_true", help="a distinct @metadata._id in every body")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-importer-"))
    procs: list[subprocess.Popen] = []
    t_start = time.monotonic()

    def spawn(argv: list[str], name: str) -> subprocess.Popen:
        log = open(base / f"{name}.log", "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        url = args.spark
        if url is None:
            port = free_port()
            spark_proc = spawn([command("logjam-spark"), "--port", str(port), "--warehouse", str(base / "server")], "spark")
            url = f"sc://127.0.0.1:{port}"
        # Start the device and the importer now: the importer waits for the Spark port by itself.
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)  # the script publishes faster than anyone can import; buffer, never drop
        pub.setsockopt(zmq.LINGER, 0)
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        dev_ports = {k: free_port() for k in ("t", "p", "P", "s")}
        spawn([command("logjam-device"), "--bind", "127.0.0.1", "-d", "3",
               *[x for k, v in dev_ports.items() for x in (f"-{k}", str(v))]], "device")
        metrics_port = free_port()
        warehouse = base / "importer"
        # The importer subscribes to this script's PUB (a stand-in device) and to the real device.
        imp = spawn([command("logjam-importer"), "--sub", f"tcp://127.0.0.1:{pub_port}",
                     "--sub", f"tcp://127.0.0.1:{dev_ports['P']}", "--spark", url, "--warehouse", str(warehouse),
                     "--batch-rows", str(args.batch_rows), "--metrics-port", str(metrics_port),
                     # Recovery stays on (its bookkeeping is on the hot path) with checkpoints of this run only.
                     "--state-dir", str(base / "state")], "importer")

        msgs = messages(args.messages, args.event_ids)
        frames = [m.to_frames() for m in msgs]
        # The reference gets the importer's own tables, built beforehand and not timed.
        batches = []
        builder = BatchBuilder()
        now_us = time.time_ns() // 1000
        for i, m in enumerate(msgs, 1):
            builder.add(m, now_us)
            if i % args.batch_rows == 0 or i == len(msgs):
                batches.append(builder.build())
        if args.spark is None:
            wait_for(lambda: port_open(port) or spark_proc.poll() is not None, timeout=90, interval=0.2,
                     what="logjam-spark")
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(url).create()
        probe = Message.build("probe-bench", "logs.probe", b"{}").to_frames()

        def importer_hears() -> bool:
            if imp.poll() is not None:
                raise SystemExit(f"logjam-importer exited:\n{(base / 'importer.log').read_text()}")
            pub.send_multipart(probe)
            return metric(metrics_port, "logjam_importer_messages_received_total") > 0
        wait_for(importer_hears, timeout=60, interval=0.1, what="the importer to subscribe")
        # First jobs in a fresh JVM run interpreted; warm up before timing either path.
        write_batch(spark, batches[0].slice(0, 10_000), output_root(str(base / "warmup"), 0))
        wait_for(lambda: metric(metrics_port, "logjam_importer_batches_written_total") >= 1, timeout=30,
                 what="the probe batch")
        base_rows = metric(metrics_port, "logjam_importer_rows_written_total")
        base_write_s = metric(metrics_port, "logjam_importer_write_seconds_sum")
        base_batches = metric(metrics_port, "logjam_importer_batches_written_total")

        t0 = time.perf_counter()
        for t in batches:
            write_batch(spark, t, output_root(str(base / "reference"), 0))
        ref_s = time.perf_counter() - t0
        ref_rate = args.messages / ref_s

        t0 = time.perf_counter()
        for f in frames:
            pub.send_multipart(f, copy=False)
        publish_s = time.perf_counter() - t0
        wait_for(lambda: metric(metrics_port, "logjam_importer_rows_written_total") >= base_rows + args.messages,
                 timeout=120, interval=0.05, what="the importer to write every row")
        imp_s = time.perf_counter() - t0
        imp_rate = args.messages / imp_s
        gaps = metric(metrics_port, "logjam_importer_gap_messages_total")
        write_s = metric(metrics_port, "logjam_importer_write_seconds_sum") - base_write_s
        jobs = metric(metrics_port, "logjam_importer_batches_written_total") - base_batches
        landed = spark.read.parquet(str(warehouse / "messages")).where("app_env LIKE 'app%'").count()

        # Latency: acknowledged publish through the real device until spark.read sees the row.
        latencies = []
        with Producer(f"tcp://127.0.0.1:{dev_ports['t']}") as producer:
            producer.ping()
            for k in range(2):
                app_env = f"latency{k}-bench"
                t0 = time.perf_counter()
                assert producer.request(app_env, "logs.bench", {"k": k})
                df = spark.read.parquet(str(warehouse / "messages"))
                wait_for(lambda: spark.read.parquet(str(warehouse / "messages")).where(f"app_env = '{app_env}'").count(),
                         timeout=30, interval=0.05, what="the latency row")
                latencies.append(time.perf_counter() - t0)
                del df

        print(f"importer benchmark: {args.messages} messages (~{sum(len(m.payload()) for m in msgs[:1000]) // 1000} B JSON, snappy), "
              f"batches of {args.batch_rows}, Spark Connect at {url}")
        print(f"  reference  createDataFrame(arrow).write.parquet: {ref_rate:10,.0f} rows/s ({ref_s:.2f} s, "
              f"{len(batches)} writes)")
        print(f"  importer   publish -> committed in Spark:         {imp_rate:10,.0f} rows/s ({imp_s:.2f} s; "
              f"publishing took {publish_s:.2f} s, {jobs:.0f} Spark writes took {write_s:.2f} s)")
        print(f"  ratio importer/reference: {imp_rate / ref_rate:.2f}x (target >= 0.8x)")
        print(f"  rows read back: {landed} of {args.messages}; gaps reported: {gaps:.0f}")
        print(f"  latency publish (device ack) -> visible to spark.read, --flush-interval 2: "
              f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s")
        print(f"  total run time {time.monotonic() - t_start:.0f} s")
        try:
            spark.stop()
        except Exception:
            pass
        pub.close()
        ctx.term()
        return 0 if landed == args.messages else 1
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
