"""The maintenance pass on a Delta table of 40 partitions: a first pass with everything due, then a steady one.

It writes a table on a local disk as importers do (harness/delta_rows.py: one commit per batch,
each batch one small file in every partition): --partitions partitions, half of them today's
(open) and half yesterday's (closed), --files files each. Then it runs warehouse/maintenance.py's
passes in this process and prints, against benchmarks/targets.toml's [maintenance]:
- the first pass (compaction of every partition, a checkpoint, log cleanup, VACUUM): wall and
  CPU seconds, files before and after;
- a steady pass with nothing due (the pass logjam-spark runs every --compact-interval): CPU
  seconds, best of 5;
- rows lost or doubled by the passes.
Usage: python benchmarks/maintenance.py [--partitions 40] [--files 40] [--rows 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from benchmarks.results import Run  # noqa: E402
from harness.delta_rows import append, rows  # noqa: E402
from table import delta  # noqa: E402
from warehouse.config import MaintenanceConfig  # noqa: E402
from warehouse.maintenance import Maintainer, add_actions  # noqa: E402
from warehouse.table_metrics import TableMetrics  # noqa: E402


def build(location: str, partitions: int, files: int, per: int) -> int:
    """The table: `files` commits of one file in each partition; returns the rows written."""
    today = dt.datetime.now(dt.timezone.utc).date()
    parts = [(f"svc{i // 2:03d}-prod", today - dt.timedelta(days=i % 2)) for i in range(partitions)]
    writer, seq = delta.Writer(location), 0
    for _ in range(files):
        batch = pa.concat_tables([rows(env, date, range(seq + i * per, seq + (i + 1) * per), body_bytes=200)
                                  for i, (env, date) in enumerate(parts)])
        append(writer, batch)
        seq += per * len(parts)
    return seq


def distinct_rows(location: str) -> tuple[int, int]:
    t = DeltaTable(location).to_pyarrow_table(columns=["device", "seq"])
    return t.num_rows, len(t.group_by(["device", "seq"]).aggregate([]))


def timed(maintainer: Maintainer, slow: bool) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    maintainer.run_pass(slow=slow)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, default=40)
    p.add_argument("--files", type=int, default=40, help="small files per partition before the first pass")
    p.add_argument("--rows", type=int, default=200, help="rows per file")
    args = p.parse_args()
    record = Run("maintenance")
    with tempfile.TemporaryDirectory(prefix="logjam-maintenance-") as tmp:
        location = f"{tmp}/messages"
        started = time.perf_counter()
        written = build(location, args.partitions, args.files, args.rows)
        print(f"maintenance benchmark: {args.partitions} partitions x {args.files} files of {args.rows} rows "
              f"written in {time.perf_counter() - started:.1f}s")
        before = add_actions(DeltaTable(location)).num_rows
        # Everything due: today's partitions have --files small files, yesterday's are closed.
        config = MaintenanceConfig(compact_min_files=min(16, args.files), compact_older_than=0, vacuum_grace_hours=0)
        maintainer = Maintainer(location, config, TableMetrics())
        first_wall, first_cpu = timed(maintainer, slow=True)
        after = add_actions(DeltaTable(location)).num_rows
        steady = min(timed(maintainer, slow=False)[1] for _ in range(5))
        steady_slow = timed(maintainer, slow=True)[1]
        total, distinct = distinct_rows(location)
    lost, doubled = written - distinct, total - distinct
    print(f"  first pass: {first_wall:.2f}s wall, {first_cpu:.2f}s CPU, {before} files -> {after}")
    print(f"  steady pass: {steady * 1000:.1f} ms CPU (target <= {record.target('steady_cpu_seconds') * 1000:g} ms); "
          f"with retention, log cleanup and VACUUM: {steady_slow * 1000:.1f} ms")
    print(f"  lost {lost}, doubled {doubled} of {written} rows")
    record.figure("first_pass_seconds", first_wall, "s")
    record.figure("first_pass_cpu_seconds", first_cpu, "s")
    record.figure("files_before", before, "files")
    record.figure("files_after", after, "files")
    record.figure("steady_slow_cpu_seconds", steady_slow, "s")
    ok = all([record.check("steady_cpu_seconds", steady), record.check("files_per_partition", after / args.partitions),
              record.check("lost", lost), record.check("doubled", doubled)])
    record.save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
