"""Spark's own ways to write prebuilt rows of the `messages` table: the importer benchmark's references.

Each method writes the same Arrow tables (the importer's own rows, decoded beforehand and
not timed) under a root of its own, partitioned by app_env and date like an importer, one
Spark job per batch, and returns rows/s from the first write to the last commit. The
benchmark takes the fastest as its reference, so the importer is compared with the best
Spark can do with these rows on this machine, not with a default:
- `connect_dataframe`: `createDataFrame(arrow)` over Spark Connect (the rows travel inside the
  request and sit in the server's heap);
- `staged_parquet`: the rows staged as one sorted Parquet file per batch, which Spark reads
  and writes (over Connect, so on the same server the importer uses), optionally with the
  file committer's algorithm 2 (not atomic per job: an importer cannot use it, the
  reference may);
- `classic_dataframe` (run in a child process, `python benchmarks/spark_writes.py classic`):
  `createDataFrame(arrow)` in a classic in-process `local[*]` session with large Arrow
  batches (`spark.sql.execution.arrow.maxRecordsPerBatch`) and optionally algorithm 2.
Every write uses the table's write options (dictionaries only on low-cardinality columns).

`python benchmarks/spark_writes.py cpu` measures Spark's CPU per row for benchmarks/e2e.py's
rows, `doc` included, in e2e-sized jobs: written by a Spark job per batch (the reference of
e2e's budget for Spark's CPU per landed event, benchmarks/targets.toml), and placed by the
importer's own writer, which leaves Spark only the catalog (importer/place.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from harness.cpu import tree_cpu_seconds  # noqa: E402
from table.schema import PARTITION_COLUMNS, WRITE_OPTIONS  # noqa: E402

_SORT = [("app_env", "ascending"), ("date", "ascending")]
_V2 = "mapreduce.fileoutputcommitter.algorithm.version"


def rebatch(tables: Sequence[pa.Table], rows: int) -> list[pa.Table]:
    whole = pa.concat_tables(tables)
    return [whole.slice(i, rows) for i in range(0, whole.num_rows, rows)]


def _append(df: Any, root: str) -> None:
    df.write.options(**WRITE_OPTIONS).mode("append").partitionBy(*PARTITION_COLUMNS).parquet(root)


def connect_dataframe(spark: Any, batches: Sequence[pa.Table], root: str) -> float:
    started = time.perf_counter()
    for table in batches:
        _append(spark.createDataFrame(table), root)
    return sum(t.num_rows for t in batches) / (time.perf_counter() - started)


def staged_parquet(spark: Any, batches: Sequence[pa.Table], root: str, stage: Path, v2: bool = False) -> float:
    stage.mkdir(parents=True, exist_ok=True)
    if v2:
        spark.conf.set(_V2, "2")
    try:
        started = time.perf_counter()
        for table in batches:
            path = stage / f"{uuid.uuid4().hex}.parquet"
            pq.write_table(table.sort_by(_SORT), path, compression="snappy",
                           row_group_size=max(1024, -(-table.num_rows // 16)))
            _append(spark.read.parquet(f"file://{path}"), root)
            path.unlink()
        return sum(t.num_rows for t in batches) / (time.perf_counter() - started)
    finally:
        if v2:
            spark.conf.unset(_V2)


def classic_dataframe(batches: Sequence[pa.Table], batch_rows: int, v2: bool, timeout: float = 300) -> float:
    """The rate of a classic local[*] session writing these batches, measured in a child process."""
    with tempfile.TemporaryDirectory(prefix="logjam-bench-classic-") as tmp:
        data = Path(tmp) / "rows.arrow"
        with pa.OSFile(str(data), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
            for t in batches:
                writer.write_table(t)
        # The parent's Connect session exports these; a classic session must not inherit them.
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
        out = subprocess.run([sys.executable, __file__, "classic", str(data), str(batch_rows), str(int(v2)), tmp],
                             capture_output=True, text=True, timeout=timeout, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"classic session failed:\n{out.stderr[-3000:]}")
        return float(json.loads(out.stdout.strip().splitlines()[-1])["rows_per_s"])


def _classic_main(data: str, batch_rows: int, v2: bool, tmp: str) -> None:
    from pyspark.sql import SparkSession

    batches = rebatch([pa.ipc.open_file(data).read_all()], batch_rows)
    builder = (SparkSession.builder.master("local[*]").appName("logjam-bench-classic")
               .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_rows))
               .config("spark.sql.warehouse.dir", f"{tmp}/warehouse"))
    if v2:
        builder = builder.config(f"spark.hadoop.{_V2}", "2")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # Warm up the JIT as the server is warmed up before its references.
    _append(spark.createDataFrame(batches[0].slice(0, 10_000)), f"{tmp}/warmup")
    started = time.perf_counter()
    for table in batches:
        _append(spark.createDataFrame(table), f"{tmp}/out")
    rate = sum(t.num_rows for t in batches) / (time.perf_counter() - started)
    print(json.dumps({"rows_per_s": rate}))
    spark.stop()


def _e2e_rows(n: int, batch: int) -> list[pa.Table]:
    """benchmarks/e2e.py's Lumberjack events as the bridge maps them, decoded into the importer's rows."""
    import random

    from harness.lumberjack_load import event
    from importer.decode import BatchBuilder
    from logjam.message import Message

    rnd, now_us = random.Random(7), time.time_ns() // 1000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    tables, builder = [], BatchBuilder()
    for i in range(n):
        body = {**event(rnd, i), "@timestamp": stamp,
                "@metadata": {"protocol": "lumberjack", "protocol_version": "2", "peer": "127.0.0.1:40000",
                              "received_at": now_us // 1000, "seq": i % 2048 + 1, "_id": f"{rnd.getrandbits(64):016x}:{i}"}}
        builder.add(Message.build("lumberjack-default", "logs.lumberjack", body, seq=i + 1, device=1), now_us)
        if (i + 1) % batch == 0 or i + 1 == n:
            tables.append(builder.build())
    return tables


def _spark_job(spark: Any, table: pa.Table, root: str, stage: Path, encoder: Any) -> None:
    """One batch the way an importer wrote it before it placed its own files: staged with `doc`
    encoded, then read and written again by one Spark job."""
    from table.schema import DOC_COLUMN, spark_read_ddl

    stage.mkdir(parents=True, exist_ok=True)
    path = stage / f"{uuid.uuid4().hex}.parquet"
    table = table.sort_by(_SORT)
    pq.write_table(table.append_column(DOC_COLUMN, encoder.column(table)), path, compression="snappy",
                   row_group_size=max(1024, -(-table.num_rows // 16)))
    # The file's data columns, `doc` as a VARIANT, and the partition columns it holds too, which `_append` partitions by.
    staged = f"{spark_read_ddl(data_only=True)}, `app_env` STRING, `date` DATE"
    _append(spark.read.schema(staged).parquet(f"file://{path}"), root)
    path.unlink()


def _cpu_main(argv: Sequence[str]) -> int:
    """Spark's CPU per row when e2e's rows, `doc` included, are written in e2e-sized jobs into a
    logjam-spark of its own, two ways: by a Spark job per batch (the staged file read and written
    again by Spark, as importers did before they placed their files), the reference of e2e's
    Spark budget (benchmarks/e2e.py's Spark CPU per landed event, targets.toml), and by the
    importer's own writer (TableWriter: it places its Parquet files itself and asks Spark only
    for new partitions)."""
    import argparse
    import shutil

    from pyspark.sql import SparkSession

    from importer.write import TableWriter
    from table.catalog import ensure_table
    from table.paths import table_path
    from harness.processes import command, free_port, port_open, wait_for

    from benchmarks.results import Run

    ap = argparse.ArgumentParser(prog="spark_writes.py cpu", description=_cpu_main.__doc__)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=30_000,
                    help="rows per job (e2e at ~29k ev/s: about 2 s of one of its two importers' rows)")
    args = ap.parse_args(argv)
    record = Run("spark_writes")
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-sparkcpu-"))
    port = free_port()
    spark_proc = subprocess.Popen([command("logjam-spark"), "--port", str(port), "--jdbc-port", "0", "--no-compact",
                                   "--warehouse", str(base / "warehouse"), "--metastore", str(base / "metastore")],
                                  stdout=open(base / "spark.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: port_open(port), timeout=180, interval=0.5, what="logjam-spark")
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        location = ensure_table(spark, "logjam", table_path(str(base / "warehouse")))
        writer = TableWriter("logjam", 0, location)
        assert writer.probe_staging(spark), "staging must work on one host"
        assert writer.doc_encoder is not None, "the C encoder is needed (LOGJAM_NATIVE)"
        tables = _e2e_rows(args.rows, args.batch)
        rows = sum(t.num_rows for t in tables)
        ways = {"a Spark job per batch (staged, doc encoded; read and written by Spark)":
                lambda t: _spark_job(spark, t, f"{location}/spark-job", base / "stage", writer.doc_encoder),
                "the importer's TableWriter (files placed by the importer)": lambda t: writer.write(spark, t)}
        print(f"spark_writes cpu: {rows} e2e rows in {len(tables)} jobs of {args.batch}, each way after the same "
              "jobs once to warm the JIT")
        per_row: list[float] = []
        for name, write in ways.items():
            for t in tables:
                write(t)
            cpu0, own0, t0 = tree_cpu_seconds(spark_proc.pid), time.process_time(), time.perf_counter()
            for t in tables:
                write(t)
            cpu, own, elapsed = (tree_cpu_seconds(spark_proc.pid) - cpu0, time.process_time() - own0,
                                 time.perf_counter() - t0)
            per_row.append(cpu / rows * 1e6)
            print(f"  {name}: logjam-spark {per_row[-1]:.1f} us per row ({cpu:.1f} s), the writer's own process "
                  f"{own / rows * 1e6:.1f} us per row; {rows / elapsed:,.0f} rows/s")
            record.figure(f"{name}: logjam-spark CPU per row", per_row[-1], "us")
            record.figure(f"{name}: the writer's own CPU per row", own / rows * 1e6, "us")
        print(f"  e2e's budget: {1.3 * per_row[0]:.1f} us of Spark CPU per landed event (1.3x Spark "
              f"writing the rows); the importer's own writer leaves Spark {per_row[1]:.1f} us per row")
        record.save()
        return 0
    finally:
        spark_proc.terminate()
        try:
            spark_proc.wait(60)
        except subprocess.TimeoutExpired:
            spark_proc.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    from runtime.lifecycle import exit_with

    if len(sys.argv) == 6 and sys.argv[1] == "classic":
        _classic_main(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5])
    elif len(sys.argv) >= 2 and sys.argv[1] == "cpu":
        exit_with(lambda: _cpu_main(sys.argv[2:]))
    else:
        sys.exit("usage: spark_writes.py cpu [--rows N] [--batch N]   (Spark CPU per row: e2e's Spark reference)\n"
                 "       spark_writes.py classic ROWS.arrow BATCH_ROWS V2 TMPDIR (run by benchmarks/importer.py)")
