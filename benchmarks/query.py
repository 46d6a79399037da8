"""Log queries on `doc` (the body as a shredded VARIANT) against `get_json_object` on `body`, side by side.

It starts a real `logjam-spark` (Spark Connect, embedded Hive metastore, `--master` as
given) over a temporary warehouse, and builds `--rows` realistic log rows (Logjam request
bodies with nested `user`, `http` and `db` objects, 1% of them not JSON) over several
app-envs and `--days` past days, the way an importer lands them: decoded by
`BatchBuilder`, committed by the importer's `TableTarget` in batches of `--batch-rows` (the
Delta table, partitioned by app_env and date, `doc` encoded as the importer does), then compacted
by `logjam-sql --compact`. It prints the bytes on disk per row before and after compaction, and
how many of them are `doc`'s (read from the Parquet footers: the size without `doc`).

Then each query runs `--repeat` times both ways on the same table; the best time of each
is printed with their ratio (`body` time / `doc` time). The last line is
`geomean speedup N.NNx` over the queries, against its target (benchmarks/targets.toml; at 2M rows).
Usage: python benchmarks/query.py [--rows 2000000] [--master local[*]] [--repeat 3]
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

import orjson
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from table.catalog import ensure_table  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from warehouse.maintenance import add_actions  # noqa: E402
from importer.decode import BatchBuilder  # noqa: E402
from table.schema import DOC_COLUMN  # noqa: E402
from importer.commit import TableTarget  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402
from benchmarks.results import Run  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402

DATABASE = "bench"
APPS = ("shop-prod", "shop-preprod", "billing-prod", "search-prod", "auth-prod", "admin-prod")
ACTIONS = [f"{c}#{a}" for c in ("Orders", "Users", "Carts", "Search", "Payments", "Sessions", "Products")
           for a in ("show", "index", "create", "update")]
LEVELS = ("debug", "info", "info", "info", "info", "warn", "error")
WORDS = ("GET", "POST", "completed", "rendered", "cache", "miss", "hit", "user", "order", "timeout", "retry",
         "upstream", "slow", "query", "payment", "declined", "session", "expired")

# (name, on `doc`, on `body`): the same question, `doc` against parsing the text. `variant_get(doc, path,
# type)` reads a shredded field as that type straight from its Parquet column; `doc:path::type` reads it
# as a VARIANT first and casts it, which was up to 2x slower (measured: 0.5-0.65x of get_json_object on
# two of these queries). The lookup keeps `doc:path` where it only fetches the fields of a few rows.
# `{T}` is the table; `{APP}`, `{DAY}`, `{SINCE}` and `{USER}` are filled in below.
QUERIES = [
    ("errors of one app in the last hour",
     "SELECT count(*), sum(variant_get(doc, '$.total_time', 'double')) FROM {T} WHERE app_env = '{APP}' "
     "AND date = DATE'{DAY}' AND created_at >= TIMESTAMP'{SINCE}' AND variant_get(doc, '$.http.status', 'int') >= 500",
     "SELECT count(*), sum(CAST(get_json_object(body, '$.total_time') AS DOUBLE)) FROM {T} WHERE app_env = '{APP}' "
     "AND date = DATE'{DAY}' AND created_at >= TIMESTAMP'{SINCE}' "
     "AND CAST(get_json_object(body, '$.http.status') AS INT) >= 500"),
    ("top actions by p99 total_time",
     "SELECT variant_get(doc, '$.action', 'string') AS action, "
     "percentile_approx(variant_get(doc, '$.total_time', 'double'), 0.99) AS p99 FROM {T} "
     "GROUP BY 1 ORDER BY 2 DESC LIMIT 10",
     "SELECT get_json_object(body, '$.action') AS action, "
     "percentile_approx(CAST(get_json_object(body, '$.total_time') AS DOUBLE), 0.99) AS p99 FROM {T} "
     "GROUP BY 1 ORDER BY 2 DESC LIMIT 10"),
    ("count by level per minute",
     "SELECT date_trunc('minute', created_at) AS minute, variant_get(doc, '$.level', 'string') AS level, count(*) "
     "FROM {T} WHERE date = DATE'{DAY}' GROUP BY 1, 2",
     "SELECT date_trunc('minute', created_at) AS minute, get_json_object(body, '$.level') AS level, count(*) "
     "FROM {T} WHERE date = DATE'{DAY}' GROUP BY 1, 2"),
    ("one nested field lookup",
     "SELECT doc:http.path::string, doc:db.queries::int FROM {T} "
     "WHERE variant_get(doc, '$.user.id', 'bigint') = {USER}",
     "SELECT get_json_object(body, '$.http.path'), CAST(get_json_object(body, '$.db.queries') AS INT) FROM {T} "
     "WHERE CAST(get_json_object(body, '$.user.id') AS BIGINT) = {USER}"),
    ("distinct count of a nested id",
     "SELECT count(DISTINCT variant_get(doc, '$.user.account.id', 'bigint')) FROM {T}",
     "SELECT count(DISTINCT CAST(get_json_object(body, '$.user.account.id') AS BIGINT)) FROM {T}"),
    ("substring search in message",
     "SELECT count(*) FROM {T} WHERE variant_get(doc, '$.message', 'string') LIKE '%declined%timeout%'",
     "SELECT count(*) FROM {T} WHERE get_json_object(body, '$.message') LIKE '%declined%timeout%'"),
]


def body(rnd: random.Random, k: int, at: datetime.datetime) -> bytes:
    """One Logjam-style request log body; about 1% are plain text (not JSON), as some shippers send."""
    if rnd.random() < 0.01:
        return f"{at.isoformat()} plain text line {k} {rnd.choice(WORDS)}".encode()
    level = rnd.choice(LEVELS)
    status = 500 + rnd.randrange(4) if level == "error" else rnd.choice((200, 200, 200, 201, 302, 304, 404))
    user = rnd.randrange(200_000)
    doc = {
        "action": rnd.choice(ACTIONS), "code": status, "level": level, "severity": LEVELS.index(level) // 2,
        "total_time": round(rnd.lognormvariate(3.5, 1.0), 2), "host": f"web-{rnd.randrange(24)}.example.net",
        "request_id": f"{rnd.getrandbits(64):016x}", "started_at": at.isoformat(),
        "message": " ".join(rnd.choice(WORDS) for _ in range(rnd.randrange(4, 12))),
        "user": {"id": user, "account": {"id": user // 7, "plan": rnd.choice(("free", "pro", "team"))}},
        "http": {"method": rnd.choice(("GET", "GET", "POST", "PUT")), "path": f"/api/v1/orders/{rnd.randrange(10**6)}",
                 "status": status},
        "db": {"queries": rnd.randrange(40), "time": round(rnd.random() * 50, 2)},
        "view_time": round(rnd.random() * 30, 2),
    }
    return orjson.dumps(doc)


def land(writer: TableTarget, rows: int, days: list[datetime.date], batch_rows: int, seed: int) -> float:
    """Decode and write `rows` rows as an importer does; returns the seconds the writes took."""
    rnd = random.Random(seed)
    start = datetime.datetime.combine(days[0], datetime.time(0), datetime.timezone.utc)
    span_ms = len(days) * 86_400_000
    step = span_ms / rows
    builder, seq, spent = BatchBuilder(), 0, 0.0
    ingested = int(time.time() * 1e6)
    while seq < rows:
        for _ in range(min(batch_rows, rows - seq)):
            seq += 1
            created = int(start.timestamp() * 1000 + seq * step)
            at = datetime.datetime.fromtimestamp(created / 1000, datetime.timezone.utc)
            builder.add_raw(APPS[seq % len(APPS)], "logs.rails", body(rnd, seq, at), 0, 1, created, seq, ingested)
        t = time.perf_counter()
        writer.append(builder.build(), None)
        spent += time.perf_counter() - t
    return spent


def disk(location: Path) -> tuple[int, int]:
    """(bytes of every live data file, bytes of the `doc` column chunks in them), from the Parquet footers."""
    total = doc = 0
    live = add_actions(DeltaTable(str(location)))["path"].to_pylist()  # the latest snapshot's files
    for path in (location / p for p in live):
        total += path.stat().st_size
        meta = pq.read_metadata(path)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                col = group.column(c)
                if col.path_in_schema.split(".")[0] == DOC_COLUMN:
                    doc += col.total_compressed_size
    return total, doc


def answer(spark, sql: str) -> list[tuple]:
    """A query's rows, sorted, floats rounded (sums of doubles may differ in their last bits)."""
    def value(v):
        return round(v, 6) if isinstance(v, float) else v
    return sorted((tuple(value(v) for v in row) for row in spark.sql(sql).collect()), key=repr)


def timed(spark, sql: str, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        spark.sql(sql).collect()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=100_000, help="rows per importer write (one commit each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each query each way; the best is printed")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    record = Run("query")

    base = Path(tempfile.mkdtemp(prefix="logjam-bench-query-"))
    port = free_port()
    log = base / "logjam-spark.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([command("logjam-spark"), "--port", str(port), "--jdbc-port", "0", "--master",
                                 args.master, "--warehouse", str(base / "warehouse"), "--metastore",
                                 str(base / "metastore")], stdout=out, stderr=subprocess.STDOUT, cwd=base)
    try:
        wait_for(lambda: port_open(port) and "table logjam.messages ready" in log.read_text(), timeout=300,
                 interval=0.5, what="logjam-spark")
        from pyspark.sql import SparkSession

        url = f"sc://127.0.0.1:{port}"
        return run(SparkSession.builder.remote(url).create(), url, base, args, record)
    finally:
        stop(proc, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def run(spark, url: str, base: Path, args: argparse.Namespace, record: Run) -> int:
    table_dir = base / "warehouse" / "messages"
    today = datetime.datetime.now(datetime.timezone.utc).date()
    days = [today - datetime.timedelta(days=args.days - i) for i in range(args.days)]
    writer = TableTarget(str(table_dir), 0)
    seconds = land(writer, args.rows, days, args.batch_rows, args.seed)
    ensure_table(spark, DATABASE, str(table_dir))
    print(f"query benchmark: {args.rows:,} rows, {len(APPS)} app-envs, {args.days} days, master {args.master}, "
          f"best of {args.repeat}")
    print(f"  committed by TableTarget in {seconds:.1f} s ({args.rows / seconds:,.0f} rows/s, doc unshredded)",
          flush=True)
    before = disk(table_dir)
    t = time.perf_counter()
    # As `logjam-spark` does when a day closes (every partition here is of a past day).
    subprocess.run([command("logjam-sql"), "--warehouse", str(base / "warehouse"), "--compact", "--older-than", "0",
                    "--vacuum-grace-hours", "0"], check=True, capture_output=True, timeout=3600)
    compact_s = time.perf_counter() - t
    after = disk(table_dir)
    for name, (total, doc) in (("before compaction", before), ("after compaction ", after)):
        print(f"  bytes/row {name}: {total / args.rows:6.1f} with doc, {(total - doc) / args.rows:6.1f} without "
              f"(doc {doc / args.rows:.1f}, {doc / total:.0%})")
    print(f"  compaction took {compact_s:.1f} s", flush=True)
    count = spark.sql(f"SELECT count(*), count(doc) FROM {DATABASE}.messages").collect()[0]
    assert int(count[0]) == args.rows, f"{count[0]} rows in the table, {args.rows} written"
    fill = {"T": f"{DATABASE}.messages", "APP": APPS[0], "DAY": days[-1].isoformat(),
            "SINCE": f"{days[-1].isoformat()} 23:00:00", "USER": 4242}
    ratios = []
    for name, on_doc, on_body in QUERIES:
        doc_sql, body_sql = on_doc.format(**fill), on_body.format(**fill)
        assert answer(spark, doc_sql) == answer(spark, body_sql), f"{name}: the two forms disagree"
        body_s, doc_s = timed(spark, body_sql, args.repeat), timed(spark, doc_sql, args.repeat)
        ratios.append(body_s / doc_s)
        print(f"  {name:38s} get_json_object {body_s:7.2f} s   doc {doc_s:7.2f} s   {body_s / doc_s:5.2f}x", flush=True)
        record.figure(f"{name}: doc / get_json_object speed-up", body_s / doc_s, "x")
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    target = record.target("geomean_speedup")
    print(f"  target {target:.0f}x: {geomean / target:.2f}x of it")
    print(f"geomean speedup {geomean:.2f}x")
    record.figure("bytes/row after compaction, with doc", after[0] / args.rows, "bytes")
    record.figure("bytes/row after compaction, of them doc", after[1] / args.rows, "bytes")
    record.check("geomean_speedup", geomean)
    record.save()
    return 0


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
