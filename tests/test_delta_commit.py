"""Exactly once through the Delta log's app transactions, against real delta-rs tables on disk.

table/delta.py `Writer.append` commits a batch with one txn per device journal and drops the
rows at or below what the table's txn already holds. These tests race two writers of one
journal (an importer and the zombie it replaced, each with its own snapshot), retry a commit
whose first attempt landed, and run writers in processes of their own: every seq lands once.
"""

from __future__ import annotations

import datetime
import multiprocessing
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from importer.commit import progress
from importer.sequence import Position
from table import delta
from table.schema import ARROW_SCHEMA, DOC_ARROW_TYPE

JOURNAL = "journal-a"
DAY = datetime.date(2026, 12, 1)


def batch(seqs: range, journal: str | None = JOURNAL, device: int = 1) -> pa.Table:
    """Rows of one device journal with these seqs, in the table's columns (`doc` last)."""
    n = len(seqs)
    now = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    values = {f.name: pa.nulls(n, f.type) for f in ARROW_SCHEMA}
    values.update({
        "app_env": pa.array(["exact-prod"] * n), "topic": pa.array(["logs"] * n),
        "device": pa.array([device] * n, pa.int64()), "seq": pa.array(list(seqs), pa.int64()),
        "journal": pa.array([journal] * n, pa.string()), "date": pa.array([DAY] * n, pa.date32()),
        "created_at": pa.array([now] * n, ARROW_SCHEMA.field("created_at").type),
        "ingested_at": pa.array([now] * n, ARROW_SCHEMA.field("ingested_at").type),
    })
    return pa.table([values[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def commit(writer: delta.Writer, rows: pa.Table, mark: dict[int, Position] | None = None) -> int:
    ids, txns = progress(rows, mark, None)
    return writer.append(delta.with_doc(rows, pa.nulls(rows.num_rows, DOC_ARROW_TYPE)), ids, txns)


def seqs(location: Path) -> list[int]:
    return sorted(DeltaTable(str(location)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist())


@pytest.mark.timeout(60)
def test_a_retried_commit_lands_nothing_twice_and_a_new_journal_starts_afresh(tmp_path) -> None:
    location = tmp_path / "messages"
    writer = delta.Writer(str(location))
    assert commit(writer, batch(range(1, 101))) == 100
    assert commit(writer, batch(range(1, 101))) == 0, "the same batch again: every row had landed"
    assert commit(writer, batch(range(51, 151))) == 50, "an overlapping batch lands only what is new"
    # A wiped journal starts again at 1 under its own id: nothing of it is taken for landed.
    assert commit(writer, batch(range(1, 11), journal="journal-b")) == 10
    assert seqs(location) == sorted([*range(1, 151), *range(1, 11)])
    table = DeltaTable(str(location))
    assert table.transaction_version(delta.app_id(JOURNAL)) == 150
    assert table.transaction_version(delta.app_id("journal-b")) == 10


@pytest.mark.timeout(60)
def test_the_mark_records_what_was_filtered_and_rows_without_a_journal_carry_no_txn(tmp_path) -> None:
    location = tmp_path / "messages"
    writer = delta.Writer(str(location))
    # Rows up to 20, and heartbeats (filtered, no rows) up to 25: the txn says 25.
    assert commit(writer, batch(range(1, 21)), {1: Position(JOURNAL, 25)}) == 20
    assert DeltaTable(str(location)).transaction_version(delta.app_id(JOURNAL)) == 25
    # Device 0, and a device whose journal is not known, are untracked: their rows always land
    # (a device without a journal starts its seqs again at 1 when it restarts), and no txn is written.
    for device in (0, 2):
        assert commit(writer, batch(range(1, 4), journal=None, device=device)) == 3
        assert commit(writer, batch(range(1, 4), journal=None, device=device)) == 3
    assert DeltaTable(str(location)).to_pyarrow_table(columns=["seq"]).num_rows == 20 + 12


@pytest.mark.timeout(60)
def test_a_zombie_writer_on_a_stale_snapshot_lands_nothing_its_successor_landed(tmp_path) -> None:
    location = tmp_path / "messages"
    zombie = delta.Writer(str(location))
    commit(zombie, batch(range(1, 51)))
    successor = delta.Writer(str(location))  # took the device over, with a snapshot of its own
    assert commit(successor, batch(range(51, 201))) == 150
    # The zombie still holds rows 51..120 and its snapshot is from before the successor's commit.
    assert commit(zombie, batch(range(51, 121))) == 0
    assert commit(zombie, batch(range(151, 231))) == 30
    assert seqs(location) == list(range(1, 231))


@pytest.mark.timeout(60)
def test_two_writers_of_one_journal_committing_on_one_snapshot_land_each_seq_once(tmp_path) -> None:
    location = tmp_path / "messages"
    delta.open_table(str(location))
    first, second = delta.Writer(str(location)), delta.Writer(str(location))
    # Both read the same snapshot (version 1, no txn) before either commits.
    assert first.landed([delta.app_id(JOURNAL)]) == second.landed([delta.app_id(JOURNAL)]) == {}
    assert commit(first, batch(range(1, 101))) == 100
    # The second's commit of an overlapping range loses the log's conflict check or reads the
    # winner's txn; either way only what is new lands.
    assert commit(second, batch(range(61, 131))) == 30
    assert seqs(location) == list(range(1, 131))


def _write_range(location: str, start: int, stop: int, step: int) -> None:
    """A writer committing `start`..`stop - 1` of the journal in order, `step` seqs a batch."""
    writer = delta.Writer(location)
    for low in range(start, stop, step):
        commit(writer, batch(range(low, min(low + step, stop))))


@pytest.mark.timeout(180)
def test_writers_in_processes_of_their_own_racing_over_one_journal_land_every_seq_once(tmp_path) -> None:
    location = str(tmp_path / "messages")
    delta.open_table(location)
    # Spawned, not forked: delta-rs's runtime does not survive a fork.
    ctx = multiprocessing.get_context("spawn")
    # Three writers send the same journal in seq order, in batches of their own sizes, as an owner
    # and the zombies it replaced each go on from where they were.
    procs = [ctx.Process(target=_write_range, args=(location, 1, 601, step)) for step in (50, 70, 90)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(150)
        assert p.exitcode == 0
    landed = DeltaTable(location).to_pyarrow_table(columns=["seq"]).column("seq")
    assert pc.count_distinct(landed).as_py() == len(landed) == 600
    assert DeltaTable(location).transaction_version(delta.app_id(JOURNAL)) == 600


@pytest.mark.timeout(60)
def test_the_log_refuses_a_second_commit_of_one_journal_on_a_stale_snapshot(tmp_path) -> None:
    """What `Writer.append` relies on when two writers commit at once: delta-rs's conflict check
    fails a commit whose snapshot predates another commit with a txn of the same appId."""
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError

    location = str(tmp_path / "messages")
    delta.open_table(location)
    first, second = DeltaTable(location), DeltaTable(location)
    rows = delta.with_doc(batch(range(1, 11)), pa.nulls(10, DOC_ARROW_TYPE))
    journal = delta.app_id(JOURNAL)
    write_deltalake(first, rows, mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(journal, 10)]))
    with pytest.raises(CommitFailedError):
        write_deltalake(second, rows, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(journal, 10)]))
    # Another journal's commit on the same stale snapshot is rebased, not refused.
    write_deltalake(second, rows, mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(delta.app_id("other"), 10)]))
    assert seqs(tmp_path / "messages") == sorted([*range(1, 11), *range(1, 11)])


@pytest.mark.timeout(60)
def test_an_append_refused_by_a_retention_delete_is_retried_and_lands_once(tmp_path) -> None:
    """The log's conflict check refuses an append whose snapshot predates a DELETE of other
    partitions (maintenance's retention, a commit with `remove`s of dataChange true), not only one
    of a commit of the same journal; `Writer.append` retries it on a fresh snapshot."""
    location = tmp_path / "messages"
    writer = delta.Writer(str(location))
    old = batch(range(1, 11), journal="journal-old")
    old = old.set_column(old.schema.get_field_index("date"), "date", pa.array([datetime.date(2026, 10, 1)] * 10))
    commit(writer, old)
    refresh, deletes = writer.refresh, []

    def refresh_then_delete() -> DeltaTable:
        table = refresh()
        if not deletes:  # between the writer's snapshot and its commit, once
            deletes.append(DeltaTable(str(location)).delete("date IN ('2026-10-01')",
                                                            post_commithook_properties=delta.NO_HOOKS))
        return table

    writer.refresh = refresh_then_delete  # type: ignore[method-assign]
    assert commit(writer, batch(range(1, 101))) == 100
    assert writer.conflicts == 1, "delta-rs rebased the append over the DELETE (then this test can go)"
    assert deletes[0]["num_deleted_rows"] == 10
    assert seqs(location) == list(range(1, 101))
    assert DeltaTable(str(location)).transaction_version(delta.app_id(JOURNAL)) == 100
