"""Makes tests/data/old_table_f8e2b8d.tar.gz: a `messages` table written by f8e2b8d, the last build before the
table became a Delta table, for tests/test_migrate.py (`logjam-sql --migrate`).

It needs that build: a checkout of f8e2b8d with its own venv (Java too, for its `logjam-spark`), and runs in
that build's Python with the checkout first on the path, from a scratch directory of its own:

    PYTHONPATH=/work/ref /work/ref/.venv/bin/python tests/data/make_old_table_f8e2b8d.py --ref /work/ref

Nothing is written into the checkout. The table is made by f8e2b8d's own code against its own `logjam-spark`
(Spark Connect, the embedded Derby catalog): importers' commits (`importer.write.TableWriter`, which places
its own Parquet files), compaction's merges (pyarrow for an open day, Spark for a closing one) and swaps,
retention's drop. Where a state is what a process killed at some step leaves, the real call is interrupted
at that step by an exception (`crash_at`), which for these calls leaves what a kill -9 there leaves (none of
them cleans up on the way out but the lock, which a dead process lets go too). The states, one or more per
partition: fresh; compacted by Spark and by pyarrow, retired files kept for their grace; strays placed after
a swap; a swap killed before and one killed after its catalog update; a compaction's output that was never
swapped; a drop killed midway and a finished one; a batch listed but half placed; one staged but never
listed; a quarantine batch whose list replaces a half placed one that was not abandoned yet.

The tarball holds `messages/` (the table's directory, hard links kept), `expected.parquet` (every row the
old table holds as committed, as the importers were handed them, with `importer` and `committed`: false for
rows that were written but are no row of the table: staged and never listed, dropped by retention) and
`notes.json` (each partition's state and the catalog's location for it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

D1, D2, OLD = "2024-05-01", "2024-05-02", "2024-04-01"
SP, SD, AP, OP = "shop-prod", "shop-dev", "auth-prod", "ops-prod"
LONG = "billing-" + "x" * 200 + "-prod"  # its directory is named after a hash, its value kept in `_app_env`


class Crash(BaseException):
    """Where a kill -9 would have stopped the process (a BaseException: nothing on the way catches it)."""


@contextlib.contextmanager
def crash_at(module: Any, name: str, call: int, under: str) -> Iterator[None]:
    """Raise Crash at the `call`-th call of `module.name` (os.rename, os.replace, ...) on a path below `under`."""
    real = getattr(module, name)
    seen = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if str(args[0]).startswith(under) if args else True:
            seen[0] += 1
            if seen[0] == call:
                raise Crash(f"{name} #{call}")
        return real(*args, **kwargs)

    setattr(module, name, counted)
    try:
        yield
    except Crash:
        pass
    else:
        raise AssertionError(f"{name} was called fewer than {call} times")
    finally:
        setattr(module, name, real)


class Rows:
    """Importer rows made by f8e2b8d's decoder, with each journal's seqs counted on, and the oracle of them."""

    def __init__(self) -> None:
        self.n = 0
        self.seqs: dict[tuple[int, str | None], int] = {}
        self.kept: list[pa.Table] = []

    def batch(self, *parts: tuple[str, int, str | None, int, str]) -> pa.Table:
        """Rows of (app_env, device, journal, count, day) each, in that order."""
        from importer.decode import BatchBuilder
        from logjam.message import Message

        builder = BatchBuilder()
        for app_env, device, journal, count, day in parts:
            noon = datetime.datetime.fromisoformat(f"{day}T12:00:00+00:00")
            for _ in range(count):
                self.n += 1
                n = self.n
                key = (device, journal)
                seq = 0
                if device:
                    seq = self.seqs[key] = self.seqs.get(key, 0) + 1
                created_ms = int(noon.timestamp() * 1000) + n * 1000
                builder.add(Message.build(app_env, "logs", body(n), seq=seq, device=device, created_ms=created_ms),
                            created_ms * 1000 + 2_000_000, journal)
        return builder.build()

    def note(self, rows: pa.Table, importer: int, committed: bool = True) -> None:
        rows = rows.append_column("importer", pa.array([importer] * rows.num_rows, pa.int32()))
        self.kept.append(rows.append_column("committed", pa.array([committed] * rows.num_rows, pa.bool_())))

    def drop_partition(self, importer: int, app_env: str, day: str) -> None:
        """The rows of a partition retention dropped are no rows of the table any more."""
        import pyarrow.compute as pc

        out = []
        for t in self.kept:
            hit = pc.and_(pc.and_(pc.equal(t.column("importer"), importer), pc.equal(t.column("app_env"), app_env)),
                          pc.equal(pc.cast(t.column("date"), pa.string()), day))
            t = t.set_column(t.schema.get_field_index("committed"), "committed",
                             pc.and_(t.column("committed"), pc.invert(hit)))
            out.append(t)
        self.kept = out


def body(n: int) -> bytes:
    """Bodies of every kind the table holds: JSON objects (nested, with ids), arrays, plain text, unicode."""
    if n % 9 == 4:
        return f"plain line {n}: no JSON here".encode()
    if n % 13 == 6:
        return f'[{n}, "x", null]'.encode()
    doc: dict[str, Any] = {"message": f"event {n} \u00e9\u2713", "level": ["info", "warn", "error"][n % 3],
                           "request_id": f"req-{n:05d}", "code": 200 + n % 5, "total_time": n / 8,
                           "nested": {"list": [n, "a", None, True, 1.5], "deep": {"k": f"v{n}"}}}
    if n % 4 == 1:
        doc["trace_id"] = f"{n:032x}"
        doc["span_id"] = f"{n:016x}"
    if n % 5 == 2:
        doc["@metadata"] = {"_id": f"ev-{n}"}
    return json.dumps(doc).encode()


def start_spark(ref: Path, base: Path) -> tuple[subprocess.Popen, str]:
    from harness.processes import free_port, wait_for

    port = free_port()
    log = base / "logjam-spark.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(ref / ".venv/bin/logjam-spark"), "--port", str(port), "--jdbc-port", "0",
                                 "--warehouse", str(base / "warehouse"), "--metastore", str(base / "metastore"),
                                 "--no-compact", "--retention-days", "0"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=base,
                                env=dict(os.environ, LOGJAM_DATA_DIR=str(base)))

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"logjam-spark exited:\n{log.read_text()}")
        return "table logjam.messages ready" in log.read_text()

    wait_for(ready, timeout=900, interval=0.5, what="logjam-spark")
    return proc, f"sc://127.0.0.1:{port}"


def place_without_follow(writer: Any, spark: Any, rows: pa.Table) -> None:
    """An importer's commit killed after its renames and before it followed the partitions (strays left)."""
    from importer.commit import Commit
    from table import protocol

    with crash_at(protocol, "follow", 1, ""):
        Commit(writer.target, rows).run(spark)


def partition(location: str, importer: int, app_env: str, day: str) -> Any:
    from table.paths import local_path, output_root, partition_dir
    from table.protocol import partition_at

    root = local_path(output_root(location, importer))
    return partition_at(importer, root, Path(partition_dir(str(root), app_env, day)), (app_env, day))


def make(ref: Path, out: Path) -> None:
    from pyspark.sql import SparkSession

    from harness.processes import stop
    from importer.commit import Commit
    from importer.write import TableWriter
    from table import placement, protocol
    from table.catalog import table_location
    from table.paths import local_path
    from table.protocol import root_lock
    from warehouse import compaction
    from warehouse.tiers import TierPolicy

    base = Path(tempfile.mkdtemp(prefix="old-table-"))
    proc, url = start_spark(ref, base)
    try:
        spark = SparkSession.builder.remote(url).create()
        db = "logjam"
        location = table_location(spark, db)
        table_dir = local_path(location)
        assert table_dir is not None
        under = str(table_dir)
        w0, w1 = TableWriter(db, 0, location), TableWriter(db, 1, location)
        assert w0.probe_staging(spark) and w1.probe_staging(spark), "Spark does not read this filesystem"
        rows = Rows()
        notes: dict[str, str] = {}

        def write(writer: Any, importer: int, *parts: tuple[str, int, str | None, int, str]) -> pa.Table:
            batch = rows.batch(*parts)
            writer.write(spark, batch)
            rows.note(batch, importer)
            return batch

        def compact(part: Any, *, closed: bool, grace: float, swap: str = "done") -> None:
            """One partition's compaction as a pass runs it, stopped where `swap` says: "unswapped" (output
            written, killed before its swap), "before-catalog" (marked swapping, killed before the catalog
            update), "after-catalog" (killed after it, before "done"), or "done"."""
            with compaction.compaction_lock(table_dir) as mine:
                assert mine
                merge = compaction.plan(spark, db, part, TierPolicy(fanin=2), closed=closed, grace=grace)
                assert merge is not None, part.dir
                compaction.write_merges(spark, [merge], table_dir / compaction.SCRATCH)
                if swap == "unswapped":
                    return
                checked = compaction.check(merge)
                with root_lock(part.root):
                    began = compaction._begin(spark, db, checked, grace)
                if swap == "before-catalog":
                    return
                protocol.move_catalog(spark, db, began)
                if swap == "after-catalog":
                    return
                with root_lock(part.root):
                    protocol.finish_swap(began)

        # Importer 0. A day retention drops whole (its dir renamed to `_dropped-*`, not yet reaped).
        write(w0, 0, (OP, 3, None, 3, OLD))
        protocol.drop(spark, db, [partition(location, 0, OP, OLD)], lambda p: True)
        rows.drop_partition(0, OP, OLD)
        notes[f"importer=0/app_env={OP}/date={OLD}"] = "dropped by retention: renamed to importer=0/_dropped-*"

        write(w0, 0, (SP, 1, "j1-old", 15, D1), (SD, 2, "j2", 8, D1), (OP, 3, None, 4, D1))
        write(w0, 0, (SP, 1, "j1-old", 15, D1), (OP, 0, None, 4, D1), (SP, 1, "j1-old", 10, D2))
        write(w0, 0, (SP, 1, "j1-old", 15, D1), (SD, 2, "j2", 8, D1), (SP, 1, "j1-old", 10, D2))
        # Device 1's journal replaced: its seqs start again at 1 under a new id.
        write(w0, 0, (SP, 1, "j1-new", 10, D2), (SD, 2, "j2", 8, D2), (LONG, 2, "j2", 6, D2))
        write(w0, 0, (SP, 1, "j1-new", 10, D2), (SD, 2, "j2", 8, D2), (LONG, 2, "j2", 6, D2))

        # shop-prod D1: the day's closing merge by Spark; the replaced files wait out their grace; then strays.
        compact(partition(location, 0, SP, D1), closed=True, grace=300)
        batch = rows.batch((SP, 1, "j1-old", 5, D1))
        place_without_follow(w0, spark, batch)
        rows.note(batch, 0)
        notes[f"importer=0/app_env={SP}/date={D1}"] = ("compacted by Spark (closing merge, _compacted-1), its "
                                                      "3 replaced files retired, 1 stray placed after")
        # shop-prod D2: merged by pyarrow, two commits followed into it, a second merge killed after its catalog
        # update (marker still "swapping"), and a stray placed while the swap was dead.
        compact(partition(location, 0, SP, D2), closed=False, grace=300)
        write(w0, 0, (SP, 1, "j1-new", 10, D2))
        write(w0, 0, (SP, 1, "j1-new", 10, D2))
        compact(partition(location, 0, SP, D2), closed=False, grace=300, swap="after-catalog")
        batch = rows.batch((SP, 1, "j1-new", 5, D2))
        place_without_follow(w0, spark, batch)
        rows.note(batch, 0)
        notes[f"importer=0/app_env={SP}/date={D2}"] = ("_compacted-1 by pyarrow, then a swap to _compacted-2 "
                                                      "killed after the catalog update, 1 stray after it")
        # ops-prod D1 (device 3 announces no journal, device 0 is untracked): a first swap killed before the catalog.
        compact(partition(location, 0, OP, D1), closed=False, grace=300, swap="before-catalog")
        notes[f"importer=0/app_env={OP}/date={D1}"] = "first swap killed before the catalog update (swapping)"
        # shop-dev D2: a merge written and never swapped (its `_compacted-1` is no one's).
        compact(partition(location, 0, SD, D2), closed=False, grace=300, swap="unswapped")
        notes[f"importer=0/app_env={SD}/date={D2}"] = "fresh, with a merge's output never swapped in"
        notes[f"importer=0/app_env={LONG}/date={D2}"] = "fresh, hash-named dir with _app_env"
        # shop-dev D1: retention killed after marking it dropping and dropping it from the catalog.
        with crash_at(os, "rename", 1, under):
            protocol.drop(spark, db, [partition(location, 0, SD, D1)], lambda p: True)
        rows.drop_partition(0, SD, D1)
        notes[f"importer=0/app_env={SD}/date={D1}"] = "dropping: killed after the catalog drop, before the rename"

        # Staging of importer 0: a batch listed and killed after its first rename (the rest waits in staging).
        batch = rows.batch((SD, 2, "j2", 4, D2), (LONG, 2, "j2", 4, D2))
        with crash_at(os, "rename", 2, under):
            Commit(w0.target, batch).run(spark)
        rows.note(batch, 0)
        # A batch whose list was cut short, its rest quarantined in a new batch whose list replaces it; killed
        # before the first list was abandoned.
        batch = rows.batch((SP, 1, "j1-new", 3, D2), (OP, 3, None, 3, D2))
        first = Commit(w0.target, batch)
        with crash_at(os, "rename", 2, under):
            first.run(spark)
        again = first.quarantined(frozenset({(SP, D2), (OP, D2)}))
        assert again.replaces == first.token
        with crash_at(placement, "abandon_placement", 1, ""):
            again.run(spark)
        rest = again.rows
        placed = batch.slice(0, batch.num_rows - rest.num_rows) if rest.num_rows < batch.num_rows else None
        assert placed is not None and _same_seqs(placed, batch, rest), "the placed part is not the batch's head"
        rows.note(placed, 0)
        rows.note(rest, 0)
        # A batch staged and killed before its list was durable: never committed (replay brings it back).
        batch = rows.batch((SP, 1, "j1-new", 5, D2))
        with crash_at(os, "replace", 1, under):
            Commit(w0.target, batch).run(spark)
        rows.note(batch, 0, committed=False)

        # Importer 1: the auth streams of device 2 (a share of its streams) and device 4.
        write(w1, 1, (AP, 2, "j2", 8, D1), (SP, 4, "j4", 6, D2))
        write(w1, 1, (AP, 2, "j2", 8, D1), (AP, 2, "j2", 6, D2))
        write(w1, 1, (AP, 2, "j2", 6, D2), (SP, 4, "j4", 5, D1))
        compact(partition(location, 1, AP, D2), closed=False, grace=0)
        with compaction.compaction_lock(table_dir):
            protocol.delete_retired(spark, db, partition(location, 1, AP, D2))
        notes[f"importer=1/app_env={AP}/date={D2}"] = "compacted by pyarrow, replaced files deleted"

        catalog = {}
        for part in protocol.local_partitions(location):
            where = protocol.partition_location(spark, db, part)
            catalog[str(part.dir.relative_to(table_dir))] = None if where is None else str(where.relative_to(table_dir))
        spark.stop()
    finally:
        stop(proc, timeout=120)

    # The quarantined rows' app_env was set anew, without its NOT NULL: one schema for all.
    expected = pa.concat_tables([t.cast(rows.kept[0].schema) for t in rows.kept])
    pq.write_table(expected, base / "expected.parquet")
    (base / "notes.json").write_text(json.dumps({"made_by": "f8e2b8d", "states": notes, "catalog": catalog},
                                                indent=1, sort_keys=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(table_dir, arcname="messages")
        tar.add(base / "expected.parquet", arcname="expected.parquet")
        tar.add(base / "notes.json", arcname="notes.json")
    shutil.rmtree(base)
    print(f"{out}: {expected.num_rows} rows written, {expected.column('committed').to_pylist().count(True)} "
          f"committed, {out.stat().st_size} bytes")


def _same_seqs(head: pa.Table, whole: pa.Table, rest: pa.Table) -> bool:
    return head.column("seq").to_pylist() + rest.column("seq").to_pylist() == whole.column("seq").to_pylist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", type=Path, default=Path("/work/ref"), help="the f8e2b8d checkout, with its .venv")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("old_table_f8e2b8d.tar.gz"))
    args = p.parse_args()
    if str(args.ref.resolve()) not in [str(Path(x).resolve()) for x in sys.path if x]:
        sys.exit(f"run with PYTHONPATH={args.ref} and {args.ref}/.venv/bin/python (see the docstring)")
    started = time.monotonic()
    make(args.ref.resolve(), args.out.resolve())
    print(f"in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
