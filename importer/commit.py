"""One batch's commit into the Delta table, as an idempotent `Commit`.

`TableTarget` is where an importer's rows go and how one commit gets them there: each row is
given its partition value (table/partitioning.py), `doc` is encoded (importer/variant.py),
and the rows become one Delta commit through delta-rs (table/delta.py `Writer.append`) with
one app transaction per device journal the batch covers. No Spark is involved.

`Commit.run()` may be called again after any failure and leaves the table as if it ran once:
the rows at or below what the table's txn already holds for their journal are dropped before
each attempt, inside the writer's optimistic retry (Kafka Connect's sink task and Delta's
streaming sink are the model: the framework retries, the table records progress).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from importer.failures import describe
from importer.sequence import Position
from importer.variant import DocEncoder
from table import delta
from table.partitioning import PartitionMap, partitions_of
from table.paths import QUARANTINE, dir_value, local_path, partition_dir

log = logging.getLogger(__name__)

Mark = Mapping[int, Position]


class TableTarget:
    """One importer's writer of the table: partition values, `doc`, and the commit with its txns."""

    def __init__(self, location: str, importer: int, *, scope: int | None = None,
                 partition_map: PartitionMap | None = None, storage_options: Mapping[str, str] | None = None,
                 scratch: Path | None = None) -> None:
        self.location = location
        self.importer = importer
        # None: this importer lands every stream of its devices, so a device's progress is the
        # device's, shared with whichever importer owns it next; else its own share's (table/delta.py app_id).
        self.scope = scope
        self.writer = delta.Writer(location, storage_options)
        self.map = partition_map or PartitionMap(importer)
        self.map.load(self.writer.table)
        self.doc_encoder = DocEncoder.load()
        self.scratch = scratch  # where `isolate` tries rows on their own; a temporary dir when None
        self._reader: DeltaTable | None = None

    def landed(self, device: int, journal: str) -> int | None:
        """The highest seq of this device journal the table holds (its txn), or None.

        Asked from the receiving thread while the writer's thread commits: on a snapshot of its own."""
        if self._reader is None:
            self._reader = DeltaTable(self.location, storage_options=self.writer.storage_options)
        else:
            self._reader.update_incremental()
        version = self._reader.transaction_version(delta.app_id(journal, self.scope))
        return None if version is None else int(version)

    def append(self, rows: pa.Table, mark: Mark | None) -> tuple[int, float]:
        """Commit `rows` (covering `mark`) once; returns (rows committed, seconds)."""
        started = time.monotonic()
        mapped, _ = self.map.apply(rows)
        keys, txns = progress(mapped, mark, self.scope)
        committed = self.writer.append(delta.with_doc(mapped, self.doc_encoder.column(mapped)), keys, txns)
        return committed, time.monotonic() - started

    def isolate(self, table: pa.Table) -> frozenset[tuple[str, str]]:
        """The (app_env, date) pairs whose rows fail by themselves while others succeed; empty when the
        failure is general (disk full, the store unreachable), which waiting mends and quarantine would not.

        Checked by halving, without committing anything: on a local table each group's partition
        directories must take a file, and each group's rows are written as a Delta table of their
        own in a scratch directory."""
        pairs = partitions_of(table)
        bad: list[tuple[str, str]] = []
        todo = [pairs]
        while todo:
            group = todo.pop()
            try:
                self._probe(table, group)
                continue
            except Exception as e:  # any failure marks the group for a closer look
                log.debug("probe of %d partitions failed: %s", len(group), describe(e))
            if len(group) == 1:
                bad.append(group[0])
            else:
                todo += [group[: len(group) // 2], group[len(group) // 2 :]]
        return frozenset() if len(bad) == len(pairs) else frozenset(bad)

    def _probe(self, table: pa.Table, group: list[tuple[str, str]]) -> None:
        wanted = set(group)
        mask = [(a, d.isoformat()) in wanted for a, d in zip(table.column("app_env").to_pylist(),
                                                             table.column("date").to_pylist())]
        rows, specs = self.map.apply(table.filter(pa.array(mask)))
        local = local_path(self.location)
        if local is not None:
            for value, day in specs:
                directory = Path(partition_dir(str(local), dir_value(value), day))
                directory.mkdir(parents=True, exist_ok=True)
                probe = directory / f".probe-{uuid.uuid4().hex}"
                probe.write_bytes(b"")
                probe.unlink()
        if self.scratch is not None:
            self.scratch.mkdir(parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(prefix="probe-", dir=self.scratch))
        try:
            write_deltalake(str(where), delta.with_doc(rows, self.doc_encoder.column(rows)),
                            partition_by=list(delta.PARTITION_COLUMNS), mode="append",
                            post_commithook_properties=delta.NO_HOOKS)
        finally:
            shutil.rmtree(where, ignore_errors=True)


def progress(rows: pa.Table, mark: Mark | None, scope: int | None) -> tuple[pa.Array, dict[str, int]]:
    """(each row's appId, null for an untracked row; appId -> the highest seq the batch covers).

    A journal's version is the mark's seq for it (which also covers the messages filtered out
    before the batch) or, for a journal the device left during the batch, its last row's seq.
    A row of device 0 or without a journal is untracked (table/delta.py)."""
    devices, journals = rows.column("device"), rows.column("journal")
    txns: dict[str, int] = {}
    if rows.num_rows:
        groups = rows.select(["device", "journal", "seq"]).group_by(["device", "journal"]).aggregate([("seq", "max")])
        for d, j, s in zip(*(groups.column(c).to_pylist() for c in ("device", "journal", "seq_max"))):
            if d and j is not None:
                txns[delta.app_id(j, scope)] = s
    for device, position in (mark or {}).items():
        if device and position.journal is not None:
            key = delta.app_id(position.journal, scope)
            txns[key] = max(txns.get(key, -1), position.seq)
    if not rows.num_rows:
        return pa.array([], pa.string()), txns
    key = pc.binary_join_element_wise(pc.cast(devices, pa.string()), pc.fill_null(journals, "\x00"), "\x01")
    encoded = pc.dictionary_encode(key).combine_chunks() if isinstance(key, pa.ChunkedArray) else pc.dictionary_encode(key)
    names = []
    for k in encoded.dictionary.to_pylist():
        d, _, j = k.partition("\x01")
        names.append(None if d == "0" or j == "\x00" else delta.app_id(j, scope))
    ids = pc.take(pa.array(names, pa.string()), encoded.indices)
    return ids, txns


class Commit:
    """One batch: its rows, the positions they cover, how far it got; `run` is idempotent."""

    def __init__(self, target: TableTarget, rows: pa.Table, mark: Mark | None = None) -> None:
        self.target = target
        self.rows = rows
        self.mark = mark
        self.committed = 0  # rows this commit landed (fewer than its rows when a failed attempt had landed)
        self.attempts = 0
        self.done = False

    def quarantined(self, pairs: frozenset[tuple[str, str]]) -> Commit:
        """The same batch, with the rows of these (app_env, date) pairs moved to the quarantine partition."""
        if not pairs:
            return self
        again = Commit(self.target, quarantined(self.rows, pairs), self.mark)
        again.attempts = self.attempts
        return again

    def run(self) -> None:
        """Commit the rows once, whatever attempts came before."""
        if self.done:
            return
        self.attempts += 1
        if self.rows.num_rows:
            self.committed, _ = self.target.append(self.rows, self.mark)
        self.done = True


def quarantined(table: pa.Table, pairs: frozenset[tuple[str, str]]) -> pa.Table:
    """The table with the rows of these (app_env, date) pairs moved to the quarantine partition, names kept."""
    names = table.column("app_env").to_pylist()
    moved = [(a, d.isoformat()) in pairs for a, d in zip(names, table.column("date").to_pylist())]
    original = table.column("original_app_env").to_pylist()
    table = table.set_column(table.schema.get_field_index("app_env"), "app_env",
                             pa.array([QUARANTINE if m else a for a, m in zip(names, moved)], pa.string()))
    return table.set_column(table.schema.get_field_index("original_app_env"), "original_app_env",
                            pa.array([a if m else o for a, o, m in zip(names, original, moved)], pa.string()))
