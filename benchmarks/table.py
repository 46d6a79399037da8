"""The table through time: files per partition, write amplification and today's query, through the real mesh.

It starts the mesh as `make up` runs it (harness/mesh.py's `Mesh`: supervisord, the
repository's supervisord.conf and defaults, spare ports, a temporary data dir). Logjam
agents (DEALER to the device) then send --rate events/s spread over --app-envs streams
for --minutes, while the benchmark samples every partition's live files every 30 s. At
the end it waits until every acknowledged event is queryable and prints, each against its
target (benchmarks/targets.toml: [table], and [table_burst] for --burst):
- files per (app_env, date) partition over time, max and median, after the first 10
  minutes, and whether that grows with the length of the run;
- bytes written per byte landed (write amplification): (what the importers wrote + what
  compaction wrote) / what the importers wrote, from logjam-spark's metrics;
- the time of `SELECT count(*) FROM logjam.messages WHERE date = current_date()` at the
  end (best of 3);
- lost and duplicated events (acknowledged against rows and distinct (device, seq)).
With --burst N it measures a burst of new streams instead: one stream flows at 100 ev/s,
then 2 events go to each of N new app-envs; it prints how long until all 2N rows are
queryable and the flowing stream's worst lag from send to queryable meanwhile.
Usage: python benchmarks/table.py [--minutes 12] [--rate 1000] [--app-envs 20] [--burst 30000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.mesh import Mesh  # noqa: E402
from warehouse.maintenance import add_actions  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from logjam.curve import ClientKey  # noqa: E402
from logjam.producer import Producer  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from tools.mesh import DEFAULTS, device_port  # noqa: E402

SAMPLE_EVERY = 30.0


def body(i: int, app_env: str) -> dict:
    return {"action": f"Orders#show{i % 7}", "code": 200 if i % 50 else 500, "total_time": (i % 997) / 3.0,
            "host": f"web-{i % 13}", "request_id": f"{app_env}-{i:012d}", "level": "info",
            "message": f"GET /orders/{i} completed 200 OK in {(i % 997) / 3.0:.1f}ms",
            "user": {"id": i % 5000, "plan": ("free", "pro", "team")[i % 3]}}


class Sender(threading.Thread):
    """Logjam agents at a steady rate, round-robin over the streams; counts what the device acknowledged."""

    def __init__(self, endpoint: list[str], rate: float, app_envs: list[str], stop: threading.Event,
                 curve: ClientKey) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.rate, self.app_envs, self.stop, self.curve = endpoint, rate, app_envs, stop, curve
        self.acked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            tick, i = 0.1, 0
            with Producer(self.endpoint, curve=self.curve, timeout=300) as p:  # an agent waits out back-pressure
                next_at = time.perf_counter()
                while not self.stop.is_set():
                    for _ in range(int(self.rate * tick)):
                        app_env = self.app_envs[i % len(self.app_envs)]
                        p.submit(app_env, "logs.rails", body(i, app_env))
                        i += 1
                    self.acked += p.flush().accepted
                    next_at += tick
                    time.sleep(max(0.0, next_at - time.perf_counter()))
        except BaseException as e:  # reported by the main thread
            self.error = e


def routers(mesh: Mesh) -> list[str]:
    """Every device's ROUTER: a Logjam agent's DEALER spreads its requests over them."""
    return [f"tcp://127.0.0.1:{device_port(mesh.env, 'LOGJAM_ROUTER_PORT', k)}"
            for k in range(int(mesh.env["LOGJAM_DEVICES"]))]


def key(mesh: Mesh) -> ClientKey:
    """The client key `make up` made for the bundled tools (CURVE is on by default)."""
    return ClientKey.from_dir(Path(mesh.env["LOGJAM_DATA_DIR"]) / "keys")


def census(location: str) -> list[int]:
    """Live files of every partition, from the table's latest snapshot."""
    if not DeltaTable.is_deltatable(location):
        return []
    per = add_actions(DeltaTable(location)).group_by(["app_env", "date"]).aggregate([("path", "count")])
    return per["path_count"].to_pylist()


def metrics(port: str | int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("logjam_compaction_bytes", "logjam_table_bytes", "logjam_compaction_seconds_",
                            "logjam_compaction_partitions_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def query_seconds(mesh: Mesh) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        mesh.spark.sql("SELECT count(*) FROM logjam.messages WHERE date = current_date()").collect()
        best = min(best, time.perf_counter() - t)
    return best


def run(mesh: Mesh, args: argparse.Namespace) -> int:
    record = Run("table")
    targets = {"files": record.target("files_per_partition"), "query": record.target("today_count_seconds")}
    location = f"{mesh.env['LOGJAM_DATA_DIR']}/warehouse/messages"
    app_envs = [f"svc{i:03d}-prod" for i in range(args.app_envs)]
    stop = threading.Event()
    sender = Sender(routers(mesh), args.rate, app_envs, stop, key(mesh))
    started = time.monotonic()
    sender.start()
    samples: list[tuple[float, int, float]] = []
    while time.monotonic() - started < args.minutes * 60:
        time.sleep(SAMPLE_EVERY)
        if sender.error:
            raise SystemExit(f"sender failed: {sender.error!r}")
        parts = census(location)
        files = parts or [0]
        samples.append((time.monotonic() - started, max(files), statistics.median(files)))
        print(f"  {samples[-1][0] / 60:5.1f} min: {len(parts)} partitions, files per partition max {max(files)}, "
              f"median {statistics.median(files):.0f}", flush=True)
    stop.set()
    sender.join(60)
    deadline = time.monotonic() + 300
    query = "SELECT count(*), count(DISTINCT device, seq) FROM logjam.messages WHERE topic = 'logs.rails'"
    while (rows := mesh.spark.sql(query).collect()[0])[0] < sender.acked and time.monotonic() < deadline:
        time.sleep(1)
    seconds = query_seconds(mesh)
    m = metrics(mesh.env["LOGJAM_TABLE_METRICS_PORT"])
    # What the importers wrote: the table now, plus what compaction merged away, less what it wrote.
    merged_in, merged_out = m.get("logjam_compaction_bytes_read_total", 0.0), m.get("logjam_compaction_bytes_written_total", 0.0)
    landed_bytes = m.get("logjam_table_bytes", 0.0) + merged_in - merged_out
    written = landed_bytes + merged_out
    late = [s for s in samples if s[0] >= 600] or samples
    worst_late = max(s[1] for s in late)
    half = len(late) // 2
    growing = half > 0 and max(s[1] for s in late[half:]) > max(s[1] for s in late[:half]) + 10
    lost, dup = max(0, sender.acked - int(rows[1])), int(rows[0]) - int(rows[1])
    print(f"table benchmark: {args.rate:,.0f} ev/s over {args.app_envs} app-envs for {args.minutes:g} min "
          f"({sender.acked} events acknowledged)")
    print(f"  files per partition after 10 min (or the whole run if shorter): max {worst_late} "
          f"({targets['files'] / max(worst_late, 1):.2f}x of the {targets['files']} target); "
          f"{'GROWING' if growing else 'not growing'} over the second half")
    print(f"  write amplification: {written / max(landed_bytes, 1):.2f} bytes written per byte landed "
          f"({landed_bytes / 2**20:.1f} MiB landed by importers, {written / 2**20:.1f} MiB written in all)")
    passes = m.get("logjam_compaction_seconds_count", 0.0)
    print(f"  compaction: {passes:.0f} passes, {m.get('logjam_compaction_seconds_sum', 0.0) / max(passes, 1):.1f} s "
          f"each on average, {m.get('logjam_compaction_partitions_total', 0.0):.0f} merges")
    print(f"  today's count(*): {seconds:.2f} s ({targets['query'] / seconds:.2f}x of the {targets['query']:g} s target)")
    print(f"  lost {lost}, duplicated {dup} (rows {int(rows[0])})")
    ok = worst_late <= targets["files"] and not growing and lost == 0 and dup == 0
    record.check("files_per_partition", worst_late)
    record.check("files_growing", growing)
    record.check("today_count_seconds", seconds)
    record.check("lost", lost)
    record.check("duplicated", dup)
    record.figure("write amplification", written / max(landed_bytes, 1), "bytes written per byte landed")
    record.save()
    return 0 if ok else 1


def burst(mesh: Mesh, args: argparse.Namespace) -> int:
    record = Run("table_burst")
    router = routers(mesh)
    stop = threading.Event()
    flow = Sender(router, 100, ["flow-prod"], stop, key(mesh))
    flow.start()
    time.sleep(15)
    lags: list[float] = []

    def watch() -> None:
        # Sent -> queryable for the stream that was flowing: now minus its newest row's created_at.
        while not stop.is_set():
            newest = mesh.spark.sql("SELECT max(created_at) FROM logjam.messages "
                                    "WHERE app_env = 'flow-prod'").collect()[0][0]
            if newest is not None:
                lags.append(time.time() - newest.timestamp())
            time.sleep(1)

    watcher = threading.Thread(target=watch, daemon=True)
    started = time.monotonic()
    watcher.start()
    with Producer(router, curve=key(mesh), timeout=300) as p:
        for i in range(args.burst):
            for k in range(2):
                p.submit(f"new{i:06d}-prod", "logs.burst", body(k, "burst"))
            if i % 500 == 499:
                p.flush()
        p.flush()
    sent = time.monotonic() - started
    landed, deadline = 0, started + 900
    while time.monotonic() < deadline and flow.error is None:
        landed = mesh.spark.sql("SELECT count(*) FROM logjam.messages WHERE topic = 'logs.burst'").collect()[0][0]
        if landed >= 2 * args.burst:
            break
        time.sleep(10)
    took = time.monotonic() - started
    time.sleep(5)
    stop.set()
    flow.join(30)
    watcher.join(30)
    if flow.error is not None:
        raise SystemExit(f"the flowing stream's sender failed: {flow.error!r}")
    parts = len(mesh.spark.sql("SHOW PARTITIONS logjam.messages").collect())
    worst = max(lags, default=float("inf"))
    limit, lag = record.target("burst_seconds"), record.target("flowing_lag")
    print(f"burst benchmark: 2 events to each of {args.burst:,} new app-envs (sent in {sent:.0f} s), one stream "
          f"flowing at 100 ev/s ({flow.acked} events)")
    print(f"  {landed:,} of {2 * args.burst:,} rows queryable after {took:.0f} s "
          f"({limit / took:.2f}x of the {limit:g} s target); {parts:,} partitions in the catalog")
    print(f"  the flowing stream's worst lag, sent -> queryable: {worst:.1f} s ({lag / max(worst, 1e-9):.2f}x of the "
          f"{lag:g} s target; median {statistics.median(lags) if lags else float('nan'):.1f} s over {len(lags)} samples)")
    record.check("burst_seconds", took if landed >= 2 * args.burst else float("nan"))
    record.check("flowing_lag", worst)
    record.figure("new streams", args.burst, "app-envs")
    record.save()
    return 0 if landed >= 2 * args.burst else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=12)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--app-envs", type=int, default=20)
    ap.add_argument("--burst", type=int, default=0, metavar="N", help="measure a burst of N new streams instead")
    ap.add_argument("--keep", action="store_true", help="keep the data dir (logs, table) and print where it is")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-table-"))
    started = time.monotonic()
    mesh = Mesh(base / "data", int(DEFAULTS["LOGJAM_DEVICES"]), int(DEFAULTS["LOGJAM_IMPORTERS"]))
    try:
        print(f"mesh up in {time.monotonic() - started:.0f} s", flush=True)
        return burst(mesh, args) if args.burst else run(mesh, args)
    finally:
        mesh.shutdown()
        if args.keep:
            print(f"  data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
