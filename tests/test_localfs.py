"""logjam-spark's local filesystem (native/java/logjam/fs): Hadoop's semantics, without child processes.

Hadoop's own local filesystem, without libhadoop, forks `chmod` for every directory and
file it creates and `ls -ld` to read a permission (docs/operations.md). The session's
server runs with those commands wrapped (tests/spark_fixture.py), so a fork that comes
back shows up in its log with our paths in it, however fast the machine is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from table.catalog import ensure_table
from table.schema import qualified
from warehouse.spark_jvm import LOCALFS_CLASS, LOCALFS_JAR
from tests.spark_fixture import append_rows, database_for

PARTITIONS = 300
DATE = "2026-11-24"


@pytest.fixture
def shim(spark_server):
    if not LOCALFS_JAR.exists():
        if os.environ.get("LOGJAM_NATIVE_WERROR", "") not in ("", "0"):
            pytest.fail(f"{LOCALFS_JAR} was not built (native/jar.py)")
        pytest.skip(f"{LOCALFS_JAR} was not built (no javac?); logjam-spark runs Hadoop's class")
    spark = spark_server.session()
    assert spark.conf.get("spark.hadoop.fs.file.impl") == LOCALFS_CLASS
    return spark


def forks_touching(spark_server, path: Path) -> list[str]:
    assert spark_server.forks is not None, "the session's server runs with the fork witnesses"
    return [line for line in spark_server.forks.read_text().splitlines() if str(path) in line]


def modes(root: Path) -> dict[str, set[int]]:
    """Permission bits of every directory and file below root, by kind."""
    seen: dict[str, set[int]] = {"dir": set(), "file": set()}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            seen["dir"].add(stat.S_IMODE(os.stat(os.path.join(dirpath, d)).st_mode))
        for f in filenames:
            seen["file"].add(stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode))
    return seen


@pytest.mark.timeout(300)
def test_a_partitioned_write_forks_nothing_and_keeps_hadoops_permissions(spark_server, shim, tmp_path) -> None:
    root = tmp_path / "parts"
    shim.range(PARTITIONS).selectExpr("concat('app-', id) AS app_env", f"'{DATE}' AS date", "id AS v") \
        .write.partitionBy("app_env", "date").parquet(str(root))

    assert shim.read.parquet(str(root)).count() == PARTITIONS
    partitions = sorted(p.relative_to(root).as_posix() for p in root.glob("app_env=*/date=*"))
    assert partitions == sorted(f"app_env=app-{i}/date={DATE}" for i in range(PARTITIONS))
    # Hadoop's defaults under its umask 022: 0777 & ~022 for directories, 0666 & ~022 for files.
    assert modes(root) == {"dir": {0o755}, "file": {0o644}}
    # The raw filesystem: no .crc beside every file (docs/operations.md has the measurement).
    assert not list(root.rglob("*.crc"))
    assert (root / "_SUCCESS").exists()
    assert forks_touching(spark_server, tmp_path) == []

    # Overwriting replaces every partition through the same rename-based commit.
    shim.range(5).selectExpr("'app-x' AS app_env", f"'{DATE}' AS date", "id AS v") \
        .write.mode("overwrite").partitionBy("app_env", "date").parquet(str(root))
    assert [p.name for p in root.glob("app_env=*")] == ["app_env=app-x"]
    assert shim.read.parquet(str(root)).count() == 5
    assert forks_touching(spark_server, tmp_path) == []


@pytest.mark.timeout(300)
def test_naming_and_reading_the_delta_table_forks_nothing(spark_server, shim, tmp_path) -> None:
    from importer.decode import BatchBuilder

    database = database_for(tmp_path)
    location = tmp_path / "messages"
    b = BatchBuilder()
    for i in range(PARTITIONS):
        b.add_raw(f"app-{i}", "logs", b'{"n": 1}', 0, 1, 1_764_000_000_000, i + 1, 1_764_000_000_000_000)
    assert append_rows(location, b.build()) == PARTITIONS
    ensure_table(shim, database, str(location))
    assert shim.sql(f"SELECT count(*), count(DISTINCT app_env) FROM {qualified(database)}").collect()[0][:] \
        == (PARTITIONS, PARTITIONS)
    assert forks_touching(spark_server, tmp_path) == []
