"""`logjam-sql --migrate` on a table that f8e2b8d really wrote: tests/data/old_table_f8e2b8d.tar.gz, made by
tests/data/make_old_table_f8e2b8d.py with that build's own importer writer, compaction, retention and Spark
(its docstring lists the states it holds: compacted by Spark and by pyarrow, strays, swaps killed before
and after the catalog update, a merge never swapped in, drops, half placed and unlisted staging, a
quarantine list replacing another). Beside the table, the tarball holds what the generator committed
(`expected.parquet`), which is what these tests compare with: the rule of table/old_layout.py is not
used to compute what is expected.

The tests need no f8e2b8d checkout: only the fixture, this build's `logjam-sql` and delta-rs (one test
reads the result through the session's Spark as well).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from harness.processes import command
from table import old_layout
from table.delta import app_id
from table.paths import dir_value
from table.schema import ARROW_SCHEMA

FIXTURE = Path(__file__).parent / "data" / "old_table_f8e2b8d.tar.gz"
D1, D2 = "2024-05-01", "2024-05-02"


def unpack(tmp: Path) -> tuple[Path, pa.Table, dict]:
    """The fixture's table at `<tmp>/wh/messages`; returns (warehouse, the rows it holds as committed, notes)."""
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp / "fixture", filter="data")
    warehouse = tmp / "wh"
    warehouse.mkdir()
    os.rename(tmp / "fixture" / "messages", warehouse / "messages")
    expected = pq.read_table(tmp / "fixture" / "expected.parquet")
    committed = expected.filter(expected.column("committed"))
    notes = json.loads((tmp / "fixture" / "notes.json").read_text())
    return warehouse, committed, notes


def migrate(warehouse: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([command("logjam-sql"), "--migrate", "--warehouse", str(warehouse), *extra],
                          capture_output=True, text=True, timeout=timeout)


def as_delta(committed: pa.Table) -> list[dict]:
    """The committed rows as the Delta table must hold them (ARROW_SCHEMA's columns), sorted by body (each is
    unique): a partition value is its directory's name, and a row whose value is not its stream's name
    keeps the name in `original_app_env`, as today's importer writes them (table/partitioning.py)."""
    rows = committed.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA).to_pylist()
    for row in rows:
        name = row["app_env"]
        row["app_env"] = dir_value(name)
        if row["original_app_env"] is None and row["app_env"] != name:
            row["original_app_env"] = name
    return sorted(rows, key=lambda r: r["body"])


def read(warehouse: Path) -> pa.Table:
    return DeltaTable(str(warehouse / "messages")).to_pyarrow_table()


def delta_rows(table: pa.Table) -> list[dict]:
    return sorted(table.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA).to_pylist(), key=lambda r: r["body"])


def expected_txns(committed: pa.Table) -> dict[str, int]:
    """What an importer resumes after: per journal the highest seq of any importer's rows, and per
    (journal, importer) that importer's; nothing for device 0 or rows without a journal."""
    out: dict[str, int] = {}
    for row in committed.select(["device", "journal", "seq", "importer"]).to_pylist():
        if row["device"] and row["journal"] is not None:
            for key in (app_id(row["journal"]), app_id(row["journal"], row["importer"])):
                out[key] = max(out.get(key, -1), row["seq"])
    return out


def log_txns(location: Path) -> dict[str, int]:
    """Every app transaction of the table's log, at its latest version (read from the log's JSON itself, so
    that an app id nobody asks for shows up too)."""
    out: dict[str, int] = {}
    for entry in sorted((location / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out[action["txn"]["appId"]] = action["txn"]["version"]
    return out


def unnamed_files(location: Path) -> list[str]:
    """Files under the Delta table's dir that its log does not name (the log and the lock aside)."""
    named = set(DeltaTable(str(location)).file_uris())
    return sorted(str(p) for p in location.rglob("*")
                  if p.is_file() and "_delta_log" not in p.parts and str(p) not in named)


def old_docs(old_dir: Path) -> dict[str, tuple[bytes, bytes]]:
    """body -> (metadata, value) of `doc` in every file an f8e2b8d importer wrote (its own encoder's bytes)."""
    out: dict[str, tuple[bytes, bytes]] = {}
    for path in old_dir.rglob("*.parquet"):
        doc_type = pq.read_schema(path).field("doc").type
        if [f.name for f in doc_type] != ["value", "metadata"]:
            continue  # Spark's closing merge stored it shredded
        table = pq.read_table(path, columns=["body", "doc"])
        for body, doc in zip(table.column("body").to_pylist(), table.column("doc").to_pylist()):
            if doc is not None:
                out[body] = (doc["metadata"], doc["value"])
    return out


def is_object(body: str | None) -> bool:
    try:
        return isinstance(json.loads(body), dict) if body is not None else False
    except ValueError:
        return False


@pytest.mark.timeout(120)
def test_the_old_table_becomes_the_delta_table_with_every_committed_row_once(tmp_path) -> None:
    warehouse, committed, notes = unpack(tmp_path)
    location = warehouse / "messages"
    assert "importer=0/app_env=shop-prod/date=2024-05-02" in notes["states"]  # the fixture is the one described

    done = migrate(warehouse)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"migrated 10 partitions of the old layout into the Delta table {location}: {committed.num_rows} rows" \
        in done.stdout, done.stdout

    table = read(warehouse)
    assert table.num_rows == committed.num_rows == 204
    assert delta_rows(table) == as_delta(committed)
    # Rows no reader of the old table saw are not in: staged but never listed, dropped by retention.
    assert Counter(r["body"] for r in delta_rows(table)) == Counter(committed.column("body").to_pylist())

    # Partitioned as the importers partition: one partition per (app_env, date), whichever importers wrote it.
    parts = {(p["app_env"], p["date"]) for p in DeltaTable(str(location)).partitions()}
    long = dir_value("billing-" + "x" * 200 + "-prod")
    assert parts == {("shop-prod", D1), ("shop-prod", D2), ("ops-prod", D1), ("shop-dev", D2), (long, D2),
                     ("~quarantine", D2), ("auth-prod", D1), ("auth-prod", D2)}

    # The importers resume after what the old table held, each in its scope; the migration's own txn counts
    # its one commit. Nothing for device 0 or device 3 (no journal).
    txns = log_txns(location)
    plan = [a for a in txns if a.startswith("logjam-migrate:")]
    assert len(plan) == 1 and txns.pop(plan[0]) == 1
    assert txns == expected_txns(committed)
    # Device 1's new journal: seqs 49..53 were staged and never listed, so its importer replays them.
    assert txns["logjam:j1-old"] == 70 and txns["logjam:j1-new"] == 48
    # Device 2's streams were split between the importers: each share has its own position.
    assert txns["logjam:j2"] == txns["logjam:j2:importer-1"] == 80 and txns["logjam:j2:importer-0"] == 52

    # `doc`: made again from `body`, byte for byte what f8e2b8d's importer stored (its Spark-shredded copy
    # of the closing merge is not read), NULL where the body is no JSON object.
    old = old_docs(warehouse / "messages.before-delta")
    docs = table.select(["body", "doc"]).to_pylist()
    assert sum(d["doc"] is not None for d in docs) > 100
    for row in docs:
        assert (row["doc"] is not None) == is_object(row["body"]), row["body"]
        if row["doc"] is not None:
            assert (row["doc"]["metadata"], row["doc"]["value"]) == old[row["body"]]

    # The old layout went aside, whole; the table's dir is the Delta table's alone, every file in its log.
    assert sorted(p.name for p in location.iterdir()) == ["_delta_log", *sorted(f"app_env={v}" for v in
                                                                                 {a for a, _ in parts})]
    assert {p.name for p in (warehouse / "messages.before-delta").iterdir()} >= {"importer=0", "importer=1",
                                                                                 "_staging"}
    assert unnamed_files(location) == []
    # delta-rs writes the Delta table's files: the protocol and the bloom filters its writers keep.
    protocol = DeltaTable(str(location)).protocol()
    assert {"variantType", "invariants"} <= set(protocol.writer_features or ())
    some = next(location.glob("app_env=shop-prod/date=2024-05-01/*.parquet"))
    meta = pq.ParquetFile(some).metadata.row_group(0)
    columns = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    assert columns["request_id"].bloom_filter_offset is not None


@pytest.mark.timeout(120)
def test_the_rule_reads_each_state_as_the_old_build_would(tmp_path) -> None:
    """table/old_layout.py on the fixture, state by state (its docstring has the rules)."""
    warehouse, committed, _ = unpack(tmp_path)
    location = warehouse / "messages"
    parts = {(p.importer, p.value, p.date): p for p in old_layout.partitions(location)}
    rows = Counter((r["importer"], r["app_env"], r["date"].isoformat()) for r in
                   committed.select(["importer", "app_env", "date"]).to_pylist())
    assert {k: sum(pq.read_metadata(f).num_rows for f in p.files) for k, p in parts.items()} == dict(rows)

    def names(key: tuple[int, str, str]) -> list[str]:
        """Its files' paths below its dir (`_compacted-1/L1-...`, `part-...`), or "staged"."""
        pdir = location / f"importer={key[0]}" / f"app_env={key[1]}" / f"date={key[2]}"
        return ["staged" if "_staging" in f.parts else str(f.relative_to(pdir)) for f in parts[key].files]

    # Compacted by Spark: its merged file and the stray placed after; the three retired files are not read.
    merged, stray = names((0, "shop-prod", D1))
    assert merged.startswith("_compacted-1/L6-") and stray.startswith("part-")
    # A swap killed after its catalog update is read from its previous location (and the strays since);
    # a first swap killed before it, from the dir.
    swapped = names((0, "shop-prod", D2))
    assert not any("_compacted-2" in n for n in swapped) and sum("_compacted-1/" in n for n in swapped) == 3
    assert all("_compacted" not in n for n in names((0, "ops-prod", D1)))
    # A merge never swapped in is nobody's; a listed file still staged counts, an unlisted one does not.
    assert all("_compacted" not in n for n in names((0, "shop-dev", D2)))
    assert names((0, "shop-dev", D2)).count("staged") == 0 and names((0, "~quarantine", D2)) == ["staged"]
    # Dropping and dropped partitions hold nothing.
    assert (0, "shop-dev", D1) not in parts and (0, "ops-prod", "2024-04-01") not in parts
    # The quarantine list replaced the first list's rest: that rest, still staged, is no row.
    staged = sorted(p.name for p in (location / "_staging" / "importer=0").glob("*.parquet"))
    counted = sorted(f.name for p in parts.values() for f in p.files if "_staging" in f.parts)
    assert len(staged) == 4 and len(counted) == 2


@pytest.mark.timeout(120)
def test_a_dead_swap_holds_the_same_rows_in_both_its_locations(tmp_path) -> None:
    """Why the rule needs no catalog for a marker left "swapping": the location it did not choose (the new
    one, plus the strays the new marker does not retire) holds the very rows of the one it reads."""
    warehouse, _, notes = unpack(tmp_path)
    location = warehouse / "messages"
    swapping = [k for k, v in notes["states"].items() if "killed" in v and "swap" in v]
    assert len(swapping) == 2
    for key in swapping:
        pdir = location / key
        marker = json.loads((pdir / "_compaction.json").read_text())
        assert marker["state"] == "swapping"
        new = pdir / f"_compacted-{marker['gen']}"
        held = sorted(p for p in new.iterdir() if not p.name.startswith(("_", ".")))
        strays = [p for p in sorted(pdir.iterdir()) if p.is_file() and not p.name.startswith(("_", "."))
                  and p.name not in marker["retire"] and not (new / p.name).exists()]
        value, day = key.split("/")[1][len("app_env="):], key.split("/")[2][len("date="):]
        chosen = next(p for p in old_layout.partitions(location) if p.importer == 0 and p.value == value
                      and p.date == day)

        def bodies(files: list[Path]) -> Counter:
            return Counter(b for f in files for b in pq.read_table(f, columns=["body"]).column(0).to_pylist())

        assert bodies(held + strays) == bodies(list(chosen.files)), key


@pytest.mark.timeout(120)
def test_a_second_migrate_changes_nothing(tmp_path) -> None:
    warehouse, committed, _ = unpack(tmp_path)
    assert migrate(warehouse).returncode == 0
    location = warehouse / "messages"
    before = (DeltaTable(str(location)).version(), sorted(str(p) for p in warehouse.rglob("*")))
    again = migrate(warehouse)
    assert again.returncode == 0, again.stderr
    assert f"{location} is a Delta table already: nothing to migrate" in again.stdout
    assert (DeltaTable(str(location)).version(), sorted(str(p) for p in warehouse.rglob("*"))) == before
    assert read(warehouse).num_rows == committed.num_rows


@pytest.mark.timeout(120)
def test_a_torn_marker_stops_the_migration_before_it_touches_anything(tmp_path) -> None:
    warehouse, _, _ = unpack(tmp_path)
    marker = warehouse / "messages" / "importer=0" / "app_env=shop-prod" / f"date={D2}" / "_compaction.json"
    marker.write_bytes(marker.read_bytes()[:40])
    before = sorted(str(p) for p in warehouse.rglob("*"))
    done = migrate(warehouse)
    assert done.returncode == 1
    assert f"{marker} does not parse" in done.stderr and "catalog" in done.stderr, done.stderr
    assert sorted(str(p) for p in warehouse.rglob("*")) == before


# The migration in a child process that kills itself (SIGKILL) at its n-th step: a commit begun (killed
# before it), a commit's rows half handed to delta-rs, a rename, an unlink or a tree removed below the
# warehouse. The code under test is not replaced, only the calls counted; then the real CLI runs again.
KILLER = """
import os, shutil, signal, sys
import tools.migrate as m

at, root, counted_in = int(sys.argv[1]), sys.argv[2], sys.argv[5]
steps = [0]

def step():
    steps[0] += 1
    with open(counted_in, "w") as f:  # the steps so far: a run that finishes says how many it has
        f.write(str(steps[0]))
    if steps[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)

def counted(fn, below=True):
    def call(*args, **kwargs):
        if not below or str(args[0]).startswith(root):
            step()
        return fn(*args, **kwargs)
    return call

batches = m._batches
def halfway(group, encoder):
    for n, batch in enumerate(batches(group, encoder)):
        if n == 1:
            step()  # delta-rs holds the group's first rows and not the rest
        yield batch

m.write_deltalake = counted(m.write_deltalake, below=False)
m._batches = halfway
os.rename, os.unlink, shutil.rmtree = counted(os.rename), counted(os.unlink), counted(shutil.rmtree)
from tools.sql import main
main(["--migrate", "--warehouse", sys.argv[3], "--migrate-commit-rows", sys.argv[4]])  # exits
"""


def old_files(location: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(location)), p.stat().st_size) for p in location.rglob("*")
                  if p.is_file() and p.parts[len(location.parts)].startswith(("importer=", "_staging")))


@pytest.mark.timeout(900)
def test_a_migration_killed_at_every_step_then_run_again_holds_every_row_once(tmp_path) -> None:
    """Killed at each step in turn: until `_delta_log` is in the table's dir the old table is whole (every file
    as it was); from then on the Delta table holds every row; and a second run finishes the job."""
    commit_rows = "40"  # a commit of at most 40 rows where partitions allow: several commits
    _, committed, _ = unpack(tmp_path / "original")
    want_rows, want_txns = as_delta(committed), expected_txns(committed)
    at = 1
    while True:
        case = tmp_path / f"at-{at}"
        case.mkdir()
        warehouse, _, _ = unpack(case)
        location = warehouse / "messages"
        files = old_files(location)
        steps = case / "steps"
        killed = subprocess.run([sys.executable, "-c", KILLER, str(at), str(warehouse), str(warehouse), commit_rows,
                                 str(steps)], capture_output=True, text=True, timeout=120)
        if killed.returncode == 0:
            break  # it finished before step `at`: every step was tried
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        if (location / "_delta_log").is_dir():
            assert delta_rows(read(warehouse)) == want_rows, at
        else:
            assert old_files(location) == files, at
        if at == 3:
            # A kill inside delta-rs's write leaves Parquet no commit names; one planted in the build stands
            # for it (this kill came between two commits), and must not reach the table.
            build = next(location.glob("_delta_build-*"))
            (build / f"app_env=shop-prod/date={D1}").mkdir(parents=True, exist_ok=True)
            (build / f"app_env=shop-prod/date={D1}" / "part-orphan.parquet").write_bytes(b"PAR1")
        again = migrate(warehouse, "--migrate-commit-rows", commit_rows)
        assert again.returncode == 0, f"killed at step {at}: {again.stderr}"
        assert delta_rows(read(warehouse)) == want_rows, at
        txns = log_txns(location)
        assert {a: v for a, v in txns.items() if not a.startswith("logjam-migrate:")} == want_txns, at
        assert unnamed_files(location) == [], at
        assert not any(p.name.startswith(("importer=", "_staging", "_delta_build")) for p in location.iterdir()), at
        assert old_files(warehouse / "messages.before-delta") == files, at
        at += 1
    total = int(steps.read_text())
    assert at == total + 1 and total >= 15, (at, total)
    table = read(warehouse)
    assert delta_rows(table) == want_rows
    commits = [a for a in log_txns(warehouse / "messages") if a.startswith("logjam-migrate:")]
    assert len(commits) == 1 and log_txns(warehouse / "messages")[commits[0]] >= 4  # several commits


@pytest.mark.timeout(120)
def test_a_run_planned_otherwise_starts_the_build_over(tmp_path) -> None:
    """Killed after two commits of 40 rows, run again with the default commit size: the groups differ, so
    the earlier build's count of groups done means nothing here; it is deleted and the table built anew."""
    warehouse, committed, _ = unpack(tmp_path)
    location = warehouse / "messages"
    killed = subprocess.run([sys.executable, "-c", KILLER, "5", str(warehouse), str(warehouse), "40",
                             str(tmp_path / "steps")], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (first,) = location.glob("_delta_build-*")
    assert DeltaTable(str(first)).to_pyarrow_table().num_rows < committed.num_rows
    again = migrate(warehouse)
    assert again.returncode == 0, again.stderr
    assert delta_rows(read(warehouse)) == as_delta(committed)
    txns = log_txns(location)
    assert [v for a, v in txns.items() if a.startswith("logjam-migrate:")] == [1]
    assert not first.exists() and not (warehouse / "messages.before-delta" / first.name).exists()


@pytest.mark.timeout(600)
def test_spark_reads_the_migrated_table_and_its_doc(spark_server, tmp_path) -> None:
    from tests.spark_fixture import table

    warehouse, committed, _ = unpack(tmp_path)
    assert migrate(warehouse).returncode == 0
    df = table(spark_server, warehouse)
    rows = df.selectExpr("body", "variant_get(doc, '$.message', 'string') AS message",
                         "variant_get(doc, '$.nested.list[0]', 'bigint') AS first").collect()
    assert len(rows) == committed.num_rows
    for row in rows:
        if is_object(row["body"]):
            parsed = json.loads(row["body"])
            assert (row["message"], row["first"]) == (parsed["message"], parsed["nested"]["list"][0])
        else:
            assert row["message"] is None
