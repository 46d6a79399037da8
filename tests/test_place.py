"""importer/place.py: a batch becomes one Parquet file per partition, placed whole or not at all,
also when the process is killed between its renames (a real child process, killed at each one).
tests/test_commit_protocol.py kills a whole commit, registration and catalog included, at every step."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from importer.decode import BatchBuilder
from importer.place import grouped, place, runs
from table.layout import LOOKUP_COLUMNS
from table.protocol import MOVES, recover_placements
from logjam.message import Message
from table.paths import partition_dir

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent
DAYS = (datetime.date(2026, 11, 26), datetime.date(2026, 11, 27))


def _rows(streams: dict[str, int]) -> pa.Table:
    """Rows of several app-envs over two days, sorted by (app_env, date) as a commit sorts them."""
    builder, seq = BatchBuilder(), 0
    for app_env, n in streams.items():
        for i in range(n):
            seq += 1
            day = DAYS[i % 2]
            created = int(datetime.datetime(day.year, day.month, day.day, 12, tzinfo=datetime.UTC).timestamp() * 1000)
            builder.add(Message.build(app_env, "logs", {"message": f"{app_env} {i}"}, seq=seq, device=1,
                                      created_ms=created), created * 1000)
    return builder.build().sort_by([("app_env", "ascending"), ("date", "ascending")])


def _placed(root: Path) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for f in sorted(root.rglob("*.parquet")):
        app_env, date = f.parent.parent.name.split("=", 1)[1], f.parent.name.split("=", 1)[1]
        out.setdefault((app_env, date), []).extend(pq.read_table(f).column("message").to_pylist())
    return out


def test_runs_are_the_partitions_of_a_sorted_table() -> None:
    table = _rows({"a-prod": 5, "b-prod": 1, "c-dev": 4})
    spans = runs(table)
    assert spans[0][0] == 0 and spans[-1][1] == table.num_rows
    assert all(a < b for a, b in spans) and all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    keys = [(table.column("app_env")[a].as_py(), table.column("date")[a].as_py()) for a, _ in spans]
    assert keys == sorted(set(keys)) and len(keys) == 5  # b-prod has one day only
    assert runs(table.slice(0, 0)) == []


def test_grouped_brings_each_partitions_rows_together_in_arrival_order() -> None:
    table = _rows({"a-prod": 6, "b-prod": 5, "c-dev": 4})
    shuffled = table.take(pa.array([7, 0, 12, 3, 9, 1, 14, 6, 2, 10, 5, 13, 8, 4, 11]))
    together = grouped(shuffled)
    keys = list(zip(together.column("app_env").to_pylist(), together.column("date").to_pylist()))
    assert [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]] == list(dict.fromkeys(keys))  # one run each
    for key in set(keys):  # arrival order kept within a partition
        before = [m for m, k in zip(shuffled.column("message").to_pylist(),
                                     zip(shuffled.column("app_env").to_pylist(), shuffled.column("date").to_pylist()))
                  if k == key]
        assert [m for m, k in zip(together.column("message").to_pylist(), keys) if k == key] == before
    assert len(runs(together)) == 6  # three app-envs, two days each


def test_grouped_leaves_a_batch_already_grouped_as_it_is() -> None:
    table = _rows({"b-prod": 3, "a-prod": 4})  # grouped, though not in name order
    one_day = table.filter(pa.compute.equal(table.column("date"), pa.scalar(DAYS[0])))
    assert grouped(one_day) is one_day
    single = table.slice(0, 1)
    assert grouped(single) is single


def test_one_file_per_partition_with_every_row_and_nothing_left_staged(tmp_path: Path) -> None:
    table = _rows({"a-prod": 7, "b-prod": 3})
    staging, root = tmp_path / "_staging", tmp_path / "importer=0"
    for key in {(a, d.isoformat()) for a in ("a-prod", "b-prod") for d in DAYS}:
        Path(partition_dir(str(root), *key)).mkdir(parents=True)
    assert place(table, staging, root, "t1") == 4
    placed = _placed(root)
    assert sorted(placed) == [(a, d.isoformat()) for a in ("a-prod", "b-prod") for d in DAYS]
    assert sorted(m for ms in placed.values() for m in ms) == sorted(table.column("message").to_pylist())
    assert list(staging.iterdir()) == []
    files = list(root.rglob("*.parquet"))
    assert all(f.name.startswith("part-") for f in files)
    assert "app_env" not in pq.read_schema(files[0]).names  # the partition columns are the directories'
    for f in files:  # the layout for lookups (table/layout.py): bloom filters on the ids, a page index
        meta = pq.read_metadata(f)
        chunks = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c)
                  for c in range(meta.num_columns)}
        assert all(chunks[c].bloom_filter_offset is not None for c in LOOKUP_COLUMNS), f
        assert {"request_id", "event_id"} <= set(LOOKUP_COLUMNS)
        assert all(c.has_column_index and c.has_offset_index for c in chunks.values()), f
        assert chunks["body"].bloom_filter_offset is None


_KILL_AT_RENAME = """
import os, sys, pyarrow.parquet as pq
from pathlib import Path
sys.path.insert(0, {root!r})
import importer.place as place
calls = [0]
def counted(real):
    def call(a, b):
        calls[0] += 1
        if calls[0] == {at}:
            os.kill(os.getpid(), 9)
        real(a, b)
    return call
os.replace, os.rename = counted(os.replace), counted(os.rename)
place.place(pq.read_table({rows!r}), Path({staging!r}), Path({root_dir!r}), "tok",
            lambda dirs: [d.mkdir(parents=True) for d in dirs])
"""


@pytest.mark.parametrize("at", [1, 2, 3, 4, 5])
def test_a_process_killed_between_renames_leaves_the_batch_whole_after_recover(tmp_path: Path, at: int) -> None:
    """Killed at the at-th rename (1: writing the list of moves; 2-5: between the partitions' renames)."""
    table = _rows({"a-prod": 6, "b-prod": 2})
    rows = tmp_path / "rows.parquet"
    pq.write_table(table, rows)
    staging, root = tmp_path / "_staging", tmp_path / "importer=0"
    code = _KILL_AT_RENAME.format(root=str(ROOT), at=at, rows=str(rows), staging=str(staging), root_dir=str(root))
    child = subprocess.run([sys.executable, "-c", code], timeout=50)
    assert child.returncode == -9
    listed = list(staging.glob(f"*{MOVES}"))
    assert len(listed) == (0 if at == 1 else 1)
    assert recover_placements(staging, root) == len(listed)
    assert list(staging.iterdir()) == []
    messages = sorted(m for ms in _placed(root).values() for m in ms)
    if at == 1:  # the list was never written: nothing of the batch is in the table, replay brings it
        assert messages == []
    else:
        assert messages == sorted(table.column("message").to_pylist())
    assert recover_placements(staging, root) == 0  # and again: nothing more to do


def test_a_partition_directory_missing_is_handed_to_ensure_dirs_before_any_rename(tmp_path: Path) -> None:
    """Placing never makes a partition's dir itself: a missing one was dropped by retention, and must be
    registered again (the caller's `ensure_dirs`) or its rows would land where the catalog does not look."""
    table = _rows({"x-prod": 2})
    root = tmp_path / "importer=3"
    asked: list[list[Path]] = []
    with pytest.raises(FileNotFoundError):
        place(table, tmp_path / "_staging", root, "t", asked.append)
    assert asked == [[Path(partition_dir(str(root), "x-prod", d.isoformat())) for d in DAYS]]
    place(table, tmp_path / "_staging", root, "t", lambda dirs: [d.mkdir(parents=True) for d in dirs])
    assert os.listdir(tmp_path / "_staging") == []
    assert len(list(root.rglob("*.parquet"))) == 2
