"""Reading a test's Delta table with delta-rs: the rows an importer committed, without a Spark server.

The importer tests check what landed in the table, and any reader of the log sees a commit
at once; the tests that need Spark's view (the catalog, JDBC, `logjam-sql`) use
tests/spark_fixture.py instead.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from deltalake import DeltaTable

from table.paths import table_path


def rows(warehouse: Path, app_envs: list[str] | None = None, columns: list[str] | None = None) -> list[SimpleNamespace]:
    """Every row of the warehouse's table (of those streams), each with its columns as attributes; [] before
    the table exists."""
    location = table_path(str(warehouse))
    if not DeltaTable.is_deltatable(location):
        return []
    filters = [("app_env", "in", list(app_envs))] if app_envs else None
    table = DeltaTable(location).to_pyarrow_table(columns=columns, filters=filters)
    return [SimpleNamespace(**r) for r in table.to_pylist()]


def count(warehouse: Path, app_envs: list[str] | None = None) -> int:
    return len(rows(warehouse, app_envs, ["seq"]))
