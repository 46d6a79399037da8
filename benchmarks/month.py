"""Benchmark: a month of logs searched the ways people search them, in the table's layout and in plain Delta files.

It starts a real `logjam-spark` (Spark Connect, Delta) and builds `--days` days (the last one
today, up to now) of `--app-envs` streams, `--rows` rows in all (default 30 x 40, 30M), through
the real write path: request-log bodies like benchmarks/query.py's, with request ids, trace and
span ids and event ids, decoded by `BatchBuilder` as an importer decodes them and committed in
batches of `--batch-rows`, then compacted by maintenance passes (warehouse/maintenance.py)
until no partition needs a compaction.

The same rows go into two Delta tables: `month`, committed by the importer's own commit
(importer/commit.py `TableTarget`: Parquet bloom filters on the lookup ids, statistics on the
columns queries narrow by, table/delta.py), and `month_plain`, the reference: the same rows
written by delta-rs with its defaults (no bloom filters, statistics on the first 32 columns).

The three lookups of one id go, on `month`, through the product's path, `tools/trace.py`'s
`lookup` (what `logjam-sql --trace` runs); on `month_plain` they are the same SQL. With
`--keep DIR` the warehouse stays in DIR, and a rerun with the same sizes only queries. Every
query runs once on both tables untimed (`--warmup` rounds: a fresh JVM's first queries are slow,
whichever they are), then `--repeat` times on each table; the best time is printed against its
target (benchmarks/targets.toml: a lookup's time and its speed-up over the reference, one
stream's last minutes, the other queries), with the reference's time and the ratio.

Run: .venv/bin/python benchmarks/month.py [--rows 30000000] [--days 30] [--app-envs 40] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.query import body as request_body  # noqa: E402
from benchmarks.query import disk  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from importer.commit import TableTarget  # noqa: E402
from importer.decode import BatchBuilder  # noqa: E402
from importer.variant import DocEncoder  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402
from table import delta  # noqa: E402
from table.catalog import ensure_table  # noqa: E402
from tools import trace  # noqa: E402
from warehouse.config import MaintenanceConfig  # noqa: E402
from warehouse.maintenance import maintenance_pass  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402
from benchmarks.results import Run  # noqa: E402


TABLES = ("month", "month_plain")  # databases, each with its `messages`
APPS = ("shop", "billing", "search", "auth", "admin", "catalog", "cart", "payments", "mailer", "media",
        "profile", "reports", "reviews", "stock", "shipping", "pricing", "gateway", "notify", "feeds", "ads")
ENVS = ("prod", "preprod")

# (name, SQL, its target in targets.toml, is a lookup). {T} the table; the rest filled in by `queries`.
# A lookup's SQL is `SELECT <columns> FROM {T} WHERE <column> = '{<needle>}'`, and LOOKUPS says
# (column, needle) for `trace.lookup`, which runs it on this build's table.
QUERIES = [
    ("one request_id, every day and stream", "SELECT app_env, created_at, message FROM {T} WHERE request_id = '{RID}'",
     "lookup_seconds", True),
    ("one trace_id", "SELECT app_env, created_at, span_id FROM {T} WHERE trace_id = '{TID}'", "lookup_seconds", True),
    ("one event_id", "SELECT app_env, created_at, seq FROM {T} WHERE event_id = '{EID}'", "lookup_seconds", True),
    ("errors of one stream, last 15 minutes",
     "SELECT created_at, action, message FROM {T} WHERE app_env = '{APP}' AND date = DATE'{TODAY}' "
     "AND created_at >= TIMESTAMP'{SINCE}' AND level = 'error'", "recent_seconds", False),
    ("count by level per day, 30 days", "SELECT date, level, count(*) FROM {T} GROUP BY 1, 2", "query_seconds", False),
    ("10 slowest actions of a day by p99",
     "SELECT action, percentile_approx(total_time, 0.99) AS p99 FROM {T} WHERE date = DATE'{DAY}' "
     "GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10", "query_seconds", False),
    ("message LIKE '%timeout%' over a day",
     "SELECT count(*) FROM {T} WHERE date = DATE'{DAY}' AND message LIKE '%timeout%'", "query_seconds", False),
    ("newest 100 rows of one stream",
     "SELECT created_at, seq, message FROM {T} WHERE app_env = '{APP}' ORDER BY created_at DESC, seq LIMIT 100",
     "query_seconds", False),
]


def streams(n: int) -> list[str]:
    return [f"{app}-{env}" for env in ENVS for app in APPS][:n]


def days_of(count: int, today: datetime.date) -> list[datetime.date]:
    return [today - datetime.timedelta(days=count - 1 - i) for i in range(count)]


def row_body(rnd: random.Random, k: int, at: datetime.datetime) -> bytes:
    """benchmarks/query.py's request log, plus a trace (most rows), a span and a Beats-style event id."""
    raw = request_body(rnd, k, at)
    if not raw.startswith(b"{"):
        return raw
    doc = orjson.loads(raw)
    if k % 4:
        doc["trace_id"] = f"{rnd.getrandbits(128):032x}"
        doc["span_id"] = f"{rnd.getrandbits(64):016x}"
    doc["@metadata"] = {"_id": f"{rnd.getrandbits(96):024x}"}
    return orjson.dumps(doc)


class PlainWriter:
    """The reference: the rows appended by delta-rs with its defaults, `doc` encoded as the importer does."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.doc = DocEncoder.load()
        delta.open_table(location)  # the same schema and partitioning

    def append(self, rows: Any, mark: Any) -> None:
        write_deltalake(self.location, delta.with_doc(rows, self.doc.column(rows)), mode="append",
                        post_commithook_properties=delta.NO_HOOKS)


def build(writers: dict[str, Any], args: argparse.Namespace, names: list[str], days: list[datetime.date],
          now: datetime.datetime) -> dict[str, str]:
    """Write the rows into every table, batch by batch in time order; returns the needles (ids of one row)."""
    rnd = random.Random(args.seed)
    start = datetime.datetime.combine(days[0], datetime.time(0), datetime.timezone.utc).timestamp() * 1000
    step = (now.timestamp() * 1000 - start) / args.rows
    needle_at = args.rows // 2 + 1
    needles: dict[str, str] = {}
    seq = 0
    ingested = int(now.timestamp() * 1e6)
    t0, reported = time.perf_counter(), 0.0
    while seq < args.rows:
        builder = BatchBuilder()
        for _ in range(min(args.batch_rows, args.rows - seq)):
            seq += 1
            created = int(start + seq * step)
            at = datetime.datetime.fromtimestamp(created / 1000, datetime.timezone.utc)
            raw = row_body(rnd, seq, at)
            if seq == needle_at:
                doc = orjson.loads(raw)
                needles = {"RID": doc["request_id"], "TID": doc["trace_id"], "EID": doc["@metadata"]["_id"]}
            builder.add_raw(names[seq % len(names)], "logs.rails", raw, 0, 1, created, seq, ingested)
        rows = builder.build()
        for writer in writers.values():
            writer.append(rows, None)
        elapsed = time.perf_counter() - t0
        if elapsed - reported >= 60 or seq == args.rows:  # a 30M build takes long: say how far it is
            reported = elapsed
            print(f"  committed {seq:,} of {args.rows:,} rows in {elapsed:.0f} s "
                  f"(~{elapsed * (args.rows - seq) / seq:.0f} s to go)", flush=True)
    return needles


def compact(locations: dict[str, str]) -> dict[str, tuple[int, float, float]]:
    """Maintenance passes, alternating between the tables, until no partition of either is compacted;
    returns (partitions compacted, seconds, CPU seconds of this process, where delta-rs runs) by table."""
    config = MaintenanceConfig(compact_older_than=0)
    done = {db: (0, 0.0, 0.0) for db in TABLES}
    busy = set(TABLES)
    while busy:
        for db in [db for db in TABLES if db in busy]:
            t, cpu = time.perf_counter(), time.process_time()
            result = maintenance_pass(locations[db], config, compact=True, slow=False)
            assert not result.failed, f"{db}: {result.failed} compactions failed"
            merges, seconds, cpu_s = done[db]
            done[db] = (merges + result.compacted, seconds + time.perf_counter() - t,
                        cpu_s + time.process_time() - cpu)
            print(f"  {db}: a maintenance pass compacted {result.compacted} partitions "
                  f"({result.files_removed} files into {result.files_added}) in {time.perf_counter() - t:.0f} s",
                  flush=True)
            if not result.compacted:
                busy.discard(db)
    return done


def best_of(spark: Any, sql: str, repeat: int) -> tuple[float, list[tuple]]:
    best, rows = math.inf, []
    for _ in range(repeat):
        t = time.perf_counter()
        rows = [tuple(r) for r in spark.sql(sql).collect()]
        best = min(best, time.perf_counter() - t)
    return best, rows


def lookup_of(sql: str) -> tuple[list[str], str, str]:
    """(columns, column, value) of a lookup's `SELECT a, b FROM t WHERE column = 'value'`."""
    head, _, cond = sql.partition(" WHERE ")
    column, _, value = cond.partition(" = ")
    return [c.strip() for c in head[len("SELECT "):].split(" FROM ")[0].split(",")], column, value.strip("'")


def best_lookup(spark: Any, sql: str, location: str, repeat: int) -> tuple[float, list[tuple]]:
    """The lookup through the product's path (tools/trace.py's `lookup`, what `logjam-sql --trace` runs)."""
    columns, column, value = lookup_of(sql)
    best, rows = math.inf, []
    for _ in range(repeat):
        t = time.perf_counter()
        found = trace.lookup(spark, "month", {column: [value]}, columns, location=location)
        rows = [tuple(r[c] for c in columns) for r in found.rows]
        best = min(best, time.perf_counter() - t)
    return best, rows


def session(url: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


def run(url: str, base: Path, args: argparse.Namespace, record: Run) -> int:
    marker = base / "month.json"
    sizes = {"rows": args.rows, "days": args.days, "app_envs": args.app_envs, "seed": args.seed,
             "batch_rows": args.batch_rows}
    built = orjson.loads(marker.read_bytes()) if marker.exists() else {}
    spark = session(url)
    locations = {db: str(base / "warehouse" / db / "messages") for db in TABLES}
    if built.get("sizes") != sizes:
        for location in locations.values():
            shutil.rmtree(location, ignore_errors=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        days = days_of(args.days, now.date())
        writers = {"month": TableTarget(locations["month"], 0), "month_plain": PlainWriter(locations["month_plain"])}
        t = time.perf_counter()
        needles = build(writers, args, streams(args.app_envs), days, now)
        placed = time.perf_counter() - t
        merged = compact(locations)
        built = {"sizes": sizes, "needles": needles, "now": now.isoformat(), "placed_s": placed, "merged": merged}
        marker.write_bytes(orjson.dumps(built))
    now = datetime.datetime.fromisoformat(built["now"])
    days = days_of(args.days, now.date())
    print(f"month benchmark: {args.rows:,} rows, {args.days} days x {args.app_envs} app-envs, master {args.master}, "
          f"best of {args.repeat}")
    print(f"  built: committed into both tables in {built['placed_s']:.0f} s")
    for db, (n, s, cpu) in built["merged"].items():
        print(f"  {db:14s} compacted in {s:.0f} s ({n} partitions), {cpu * 1e6 / args.rows:.1f} us of CPU a row "
              "(delta-rs, in this process)")
    for db in TABLES:
        ensure_table(spark, db, locations[db])
        total, _doc = disk(Path(locations[db]))
        print(f"  {db:14s} {total / args.rows:6.1f} bytes on disk a row")
    fill = {**built["needles"], "APP": streams(args.app_envs)[0], "TODAY": now.date().isoformat(),
            "SINCE": (now - datetime.timedelta(minutes=15)).strftime("%Y-%m-%d %H:%M:%S"),
            "DAY": days[len(days) // 2].isoformat()}
    location = locations["month"]
    for _ in range(args.warmup):  # a fresh JVM's first queries are slow, whichever comes first (JIT, classes)
        for name, sql, target, lookup in QUERIES:
            if lookup:
                best_lookup(spark, sql.format(T="month.messages", **fill), location, 1)
            else:
                best_of(spark, sql.format(T="month.messages", **fill), 1)
            best_of(spark, sql.format(T="month_plain.messages", **fill), 1)
    missed = 0
    for name, sql, target_name, lookup in QUERIES:
        target = record.target(target_name)
        if lookup:
            ours, got = best_lookup(spark, sql.format(T="month.messages", **fill), location, args.repeat)
        else:
            ours, got = best_of(spark, sql.format(T="month.messages", **fill), args.repeat)
        ref, expected = best_of(spark, sql.format(T="month_plain.messages", **fill), args.repeat)
        assert sorted(map(repr, got)) == sorted(map(repr, expected)), f"{name}: the two tables disagree"
        assert got, f"{name}: no rows"
        met = record.check(target_name, ours, name)
        if lookup:
            met = record.check("lookup_speedup", ref / ours, name) and met
        record.figure(f"{name}, plain layout", ref, "s")
        missed += not met
        goal = f"<= {target:.0f} s" + (f", >= {record.target('lookup_speedup'):.0f}x" if lookup else "")
        print(f"  {name:40s} {ours:6.2f} s   plain layout {ref:6.2f} s   {ref / ours:5.1f}x   "
              f"target {goal}: {'met' if met else 'MISSED'}", flush=True)
    print(f"{len(QUERIES) - missed} of {len(QUERIES)} queries met their targets")
    record.save()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30_000_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--app-envs", type=int, default=40, choices=range(1, len(APPS) * len(ENVS) + 1),
                    metavar=f"1..{len(APPS) * len(ENVS)}")
    ap.add_argument("--batch-rows", type=int, default=200_000, help="rows per importer write")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each query on each table; the best is printed")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of every query on both tables first")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, metavar="DIR", help="build (or reuse) the warehouse in DIR and keep it")
    args = ap.parse_args()
    record = Run("month")

    base = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="logjam-bench-month-"))
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = base / "logjam-spark.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([command("logjam-spark"), "--port", str(port), "--jdbc-port", "0", "--master",
                                 args.master, "--warehouse", str(base / "warehouse"), "--metastore",
                                 str(base / "metastore"), "--no-compact"], stdout=out, stderr=subprocess.STDOUT,
                                cwd=base)
    try:
        wait_for(lambda: port_open(port) and "table logjam.messages ready" in log.read_text(), timeout=300,
                 interval=0.5, what="logjam-spark")
        return run(f"sc://127.0.0.1:{port}", base, args, record)
    finally:
        stop(proc, timeout=60)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
