"""What a new partition costs the Spark server, with Hadoop's local filesystem and with ours.

Without libhadoop, Hadoop's local filesystem forks `chmod` for every directory and file it
creates and `ls -ld` for permissions (docs/operations.md). logjam-spark names
logjam.fs.NioRawLocalFileSystem (native/java/) in `fs.file.impl` instead. For each variant
below this starts a real `logjam-spark` (Connect only, a warehouse under a temporary dir)
and measures, on partitions that do not exist yet:
- write: `partitionBy("app_env", "date").parquet(...)` of N rows, one per new partition
  (N = --partitions, default 1000 and 5000), as an importer's batch writes them;
- add: one `ALTER TABLE messages ADD IF NOT EXISTS` of --add new partitions (default 1000),
  as table/catalog.py sends them, first with no directories, then with the directories
  created beforehand (as the writer leaves them).
Variants: `hadoop` (Hadoop's LocalFileSystem: the reference), `nio` (the default),
`nio+crc` (our class under Hadoop's checksummed LocalFileSystem, which writes .crc files),
and each with `hive.warehouse.subdir.inherit.perms` off (`-noinherit`).
Usage: python benchmarks/localfs.py [--variants hadoop,nio] [--partitions 1000,5000] [--add 1000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import Run  # noqa: E402
from table.catalog import ensure_table  # noqa: E402
from table.schema import partition_clause, qualified  # noqa: E402
from harness.processes import command, free_port, port_open, stop, wait_for  # noqa: E402

VARIANTS = {
    "hadoop": ["spark.hadoop.fs.file.impl=org.apache.hadoop.fs.LocalFileSystem"],
    "hadoop-noinherit": ["spark.hadoop.fs.file.impl=org.apache.hadoop.fs.LocalFileSystem",
                         "spark.hadoop.hive.warehouse.subdir.inherit.perms=false"],
    "nio": [],
    "nio-noinherit": ["spark.hadoop.hive.warehouse.subdir.inherit.perms=false"],
    "nio+crc": ["spark.hadoop.fs.file.impl=logjam.fs.NioLocalFileSystem"],
}
DATE = "2026-11-24"


def start(base: Path, confs: list[str]) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    log = base / "logjam-spark.log"
    argv = [command("logjam-spark"), "--port", str(port), "--jdbc-port", "0", "--warehouse", str(base / "warehouse"),
            "--metastore", str(base / "metastore"), "--no-compact"]
    for c in confs:
        argv += ["--conf", c]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=base)

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"logjam-spark exited early:\n{log.read_text(errors='replace')}")
        return port_open(port) and "table logjam.messages ready" in log.read_text(errors="replace")

    wait_for(ready, timeout=300, interval=0.5, what="logjam-spark")
    return proc, port, log


def timed_write(spark, root: str, n: int, tag: str) -> float:
    df = spark.range(n).selectExpr(f"concat('{tag}-', id) AS app_env", f"'{DATE}' AS date", "id AS v")
    t0 = time.perf_counter()
    df.write.partitionBy("app_env", "date").parquet(root)
    return time.perf_counter() - t0


def timed_add(spark, database: str, table_dir: Path, n: int, tag: str, precreate: bool) -> float:
    apps = [f"{tag}-{i}" for i in range(n)]
    if precreate:
        for a in apps:
            (table_dir / "importer=0" / f"app_env={a}" / f"date={DATE}").mkdir(parents=True)
    clauses = " ".join(partition_clause(0, a, DATE) for a in apps)
    t0 = time.perf_counter()
    spark.sql(f"ALTER TABLE {qualified(database)} ADD IF NOT EXISTS {clauses}")
    return time.perf_counter() - t0


def run_variant(name: str, partitions: list[int], add: int, tmp: Path) -> dict[str, float]:
    from pyspark.sql import SparkSession

    base = tmp / name
    base.mkdir()
    proc, port, log = start(base, VARIANTS[name])
    results: dict[str, float] = {}
    try:
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        impl = spark.conf.get("spark.hadoop.fs.file.impl", "(Hadoop's default)")
        print(f"== {name}: fs.file.impl = {impl}", flush=True)
        spark.range(10).selectExpr("id AS v", "'w' AS app_env", f"'{DATE}' AS date") \
            .write.partitionBy("app_env", "date").parquet(str(base / "warmup"))
        if "noinherit" not in name:
            for n in partitions:
                s = timed_write(spark, str(base / f"write{n}"), n, f"w{n}")
                results[f"write {n}"] = s
                print(f"   write of {n} new partitions: {s:7.2f} s  ({s / n * 1000:5.2f} ms/partition)", flush=True)
        table_dir = base / "bench_table"
        ensure_table(spark, "bench", str(table_dir))
        timed_add(spark, "bench", table_dir, 10, "warm", False)
        for precreate in (False, True):
            s = timed_add(spark, "bench", table_dir, add, f"a{int(precreate)}", precreate)
            key = f"add {add}" + (" (dirs exist)" if precreate else "")
            results[key] = s
            print(f"   {key:>24}: {s:7.2f} s  ({s / add * 1000:5.2f} ms/partition)", flush=True)
        spark.stop()
    finally:
        stop(proc, timeout=60)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="hadoop,hadoop-noinherit,nio,nio-noinherit,nio+crc")
    p.add_argument("--partitions", default="1000,5000")
    p.add_argument("--add", type=int, default=1000)
    a = p.parse_args()
    run = Run("localfs")
    partitions = [int(x) for x in a.partitions.split(",") if x]
    table: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="wtfs-localfs-", dir=os.environ.get("LOGJAM_BENCH_TMP")) as tmp:
        for name in a.variants.split(","):
            table[name] = run_variant(name, partitions, a.add, Path(tmp))
    ref = table.get("hadoop", {})
    print("\nresult (seconds; x = speed-up over `hadoop`, measured in this run)")
    for name, res in table.items():
        cells = [f"{k}: {v:.2f}" + (f" (x{ref[k] / v:.1f})" if k in ref and name != "hadoop" else "")
                 for k, v in res.items()]
        print(f"  {name:18} " + "; ".join(cells))
        for k, v in res.items():
            run.figure(f"{name}: {k}", v, "s")
    run.save()


if __name__ == "__main__":
    main()
