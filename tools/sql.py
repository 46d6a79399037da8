"""`logjam-sql "SELECT ..."`: run a query against the `logjam.messages` table and print the result.

`logjam-sql --trace ID` prints every row of one request or trace instead (tools/trace.py);
`--compact` and `--retention-days` run a maintenance pass; `--migrate` moves a table of the old
layout (f8e2b8d and before) into the Delta table in its place (tools/migrate.py).

It talks to `logjam-spark` through Spark Connect (or starts a classic session for a master
URL such as `local[2]`), makes `--database` the current database so that `messages` alone
names the table (`logjam.messages` works too), and, when this Spark's catalog names no such
table, creates the Delta table over `<warehouse>/messages` (or opens the one there) and names it.
Output is an aligned text table, or one JSON object per row with `--json`.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import decimal
import logging
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from table.catalog import named_table
from warehouse.config import MaintenanceConfig
from warehouse.maintenance import maintenance_pass
from tools.migrate import ROWS_PER_COMMIT, MigrationError, migrate, summary
from table.paths import default_warehouse, table_path
from table.schema import DEFAULT_DATABASE
from table.checks import local_dir, spark_url
from table.session import DEFAULT_SPARK, connect_refused, is_connect, open_session, resolve_warehouse
from runtime import lifecycle
from runtime.check import Checker
from runtime.config import add_config_flag, from_flags, parse_config, setup_logging
from tools import trace

log = logging.getLogger("logjam-sql")


@dataclass(frozen=True, slots=True)
class SqlConfig:
    """What one logjam-sql run does (the flags below have the help)."""

    query: str | None  # None: --trace, a maintenance pass (--compact / --retention-days), or --migrate
    trace: str | None  # a request id or trace id to show every row of (tools/trace.py)
    days: int  # --trace searches the last N days (0: all)
    compact: bool
    migrate: bool  # move a table of the old layout into the Delta table (tools/migrate.py)
    migrate_commit_rows: int
    older_than: float
    vacuum_grace_hours: int
    retention_days: int
    spark: str
    warehouse: str | None
    database: str
    json: bool
    max_rows: int
    max_width: int
    verbose: bool

    def __post_init__(self) -> None:
        self.maintenance  # noqa: B018 (building it checks the maintenance flags, in warehouse/config.py)

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "SqlConfig":
        return from_flags(cls, args)

    @property
    def maintenance(self) -> MaintenanceConfig:
        """The pass logjam-spark would run, with this run's retention, closed days and grace."""
        return MaintenanceConfig(retention_days=self.retention_days, compact_older_than=self.older_than,
                                 vacuum_grace_hours=self.vacuum_grace_hours)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-sql", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("query", nargs="?", help='SQL, e.g. "SELECT app_env, count(*) FROM messages GROUP BY 1"')
    p.add_argument("--trace", metavar="ID",
                   help="every row with this request_id or trace_id, from every stream, as a timeline: one line "
                        "a row, cut at max(--max-width, 100) characters only on a terminal (whole in a pipe or "
                        "file); with --json, one JSON object per row (JSON Lines) and the header on stderr")
    p.add_argument("--days", type=int, default=0, metavar="N", help="--trace searches the last N days (default: all)")
    p.add_argument("--compact", action="store_true",
                   help="run one maintenance pass now (compaction, checkpoint, log cleanup, VACUUM, as logjam-spark "
                        "does on a schedule), instead of a query")
    p.add_argument("--migrate", action="store_true",
                   help="move the table of the old layout at <warehouse>/messages (f8e2b8d and before: importer=* "
                        "directories, no _delta_log) into the Delta table there, every committed row once, with "
                        "the importers' progress; safe to kill and run again; no Spark (docs/operations.md). Run "
                        "it with the mesh stopped. The warehouse: --warehouse, else the data root's "
                        "($LOGJAM_DATA_DIR/warehouse, or ./data/warehouse)")
    p.add_argument("--migrate-commit-rows", type=int, default=ROWS_PER_COMMIT, metavar="N",
                   help="with --migrate: rows per commit, which bounds the memory a commit takes (default "
                        f"{ROWS_PER_COMMIT:,}; a larger partition is one commit, streamed)")
    p.add_argument("--older-than", type=duration, default=MaintenanceConfig().compact_older_than, metavar="AGE",
                   help="with --compact: a day is closed AGE after it ended, e.g. 0, 90m, 12h, 2d (default 1h)")
    p.add_argument("--vacuum-grace-hours", type=int, default=MaintenanceConfig().vacuum_grace_hours, metavar="HOURS",
                   help="with --compact: VACUUM keeps removed files this long for queries already planned "
                        "(default 1)")
    p.add_argument("--retention-days", type=int, default=0, metavar="N",
                   help="drop partitions older than N days now (with --compact or alone)")
    p.add_argument("--spark", default=DEFAULT_SPARK, metavar="URL", help="Spark Connect URL (or a master URL such as local[*])")
    p.add_argument("--warehouse", metavar="DIR",
                   help="where the table is created if it does not exist yet (default: the server's warehouse)")
    p.add_argument("--database", default=DEFAULT_DATABASE, help="database of the messages table (default logjam)")
    p.add_argument("--json", action="store_true", help="print one JSON object per row")
    p.add_argument("--max-rows", type=int, default=1000, help="print at most this many rows (0: all)")
    p.add_argument("--max-width", type=int, default=60, help="truncate table cells to this many characters (0: never)")
    p.add_argument("-v", "--verbose", action="store_true")
    add_config_flag(p)
    return p


def duration(text: str) -> float:
    """Seconds in `30`, `30s`, `90m`, `12h` or `2d`."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    scale = units.get(text[-1:], 0)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 0, 90m, 12h or 2d)") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a duration cannot be negative")
    return value


def _json_default(v: Any) -> Any:
    if hasattr(v, "toJson"):  # a VARIANT (`doc`): its JSON, as JSON rather than as a string of it
        return orjson.Fragment(v.toJson())
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    return str(v)


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, datetime.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (bytes, bytearray)):
        return "0x" + bytes(v).hex()
    return str(v)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 60) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    if max_width:
        cells = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in row] for row in cells]
        cells = [[c.replace("\n", "\\n") for c in row] for row in cells]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |", line]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    out.append(line)
    return "\n".join(out)


def run(config: SqlConfig) -> int:
    if config.migrate:
        return migrate_table(config)
    from pyspark.errors import PySparkException

    if config.query is None and config.trace is None and config.warehouse:
        # Maintenance is delta-rs's alone: with the warehouse given, no Spark is asked.
        return maintain(table_path(resolve_warehouse(None, config.warehouse)), config)
    if is_connect(config.spark) and (refused := connect_refused(config.spark)):
        print(f"logjam-sql: no Spark Connect server answers at {refused} (is logjam-spark running? make status)",
              file=sys.stderr)
        return 1
    spark = open_session(config.spark, app_name="logjam-sql", warehouse=config.warehouse)
    if is_connect(config.spark):
        # A one-shot query gains nothing from reattaching, and its asynchronous release races
        # our session close, leaving SESSION_CLOSED errors in the server log.
        spark.client.disable_reattachable_execute()
    try:
        location = named_table(spark, config.database, table_path(resolve_warehouse(spark, config.warehouse)))
        if config.trace is not None:
            return show_trace(spark, config, location)
        if config.query is None:
            return maintain(location, config)
        spark.sql(f"USE `{config.database}`")
        df = spark.sql(config.query)
        columns = df.columns
        limited = df.limit(config.max_rows + 1) if config.max_rows else df
        rows = [tuple(r) for r in limited.collect()]
    except PySparkException as e:
        print(f"logjam-sql: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        try:
            spark.stop()
        except Exception:  # closing a broken session must not hide the real error
            pass
    truncated = bool(config.max_rows) and len(rows) > config.max_rows
    rows = rows[: config.max_rows] if config.max_rows else rows
    out = sys.stdout
    if config.json:
        for row in rows:
            out.write(orjson.dumps(dict(zip(columns, row)), default=_json_default,
                                   option=orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        out.write(format_table(columns, rows, config.max_width) + "\n")
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', truncated' if truncated else ''})\n")
    if truncated:
        print(f"logjam-sql: only the first {config.max_rows} rows shown (--max-rows)", file=sys.stderr)
    return 0


def show_trace(spark: Any, config: SqlConfig, location: str | None = None) -> int:
    """`--trace ID`: the timeline (tools/trace.py); with --json, one object a row and the header on stderr.
    Lines are cut only on a terminal: a timeline saved or piped keeps every message whole."""
    timeline = trace.find(spark, config.database, config.trace or "", config.days, location)
    if config.json:
        print(trace.header(timeline), file=sys.stderr)
        for row in timeline.rows:
            sys.stdout.write(orjson.dumps(row, default=_json_default, option=orjson.OPT_NAIVE_UTC).decode() + "\n")
    else:
        # Cut for a person at a terminal only: what goes to a pipe or a file is read whole, later or by a script.
        width = (config.max_width and max(config.max_width, 100)) if sys.stdout.isatty() else 0
        print(trace.render(timeline, width))
    return 0


def maintain(location: str, config: SqlConfig) -> int:
    """`--compact` / `--retention-days` without a query: one maintenance pass of the table, then a summary line."""
    done = maintenance_pass(location, config.maintenance, compact=config.compact)
    print(f"compacted {done.compacted} partitions ({done.files_removed} files into {done.files_added}); retention "
          f"removed {done.dropped} files ({done.rows_dropped} rows); vacuum deleted {done.vacuumed} files; "
          f"{done.failed} steps failed, {done.conflicts} lost to other writers")
    return 1 if done.failed else 0


def migrate_table(config: SqlConfig) -> int:
    """`--migrate`: the old table at `<warehouse>/messages` becomes the Delta table, then a summary line."""
    warehouse = resolve_warehouse(None, config.warehouse or default_warehouse())
    try:
        done = migrate(warehouse, config.migrate_commit_rows)
    except (MigrationError, OSError) as e:
        print(f"logjam-sql: --migrate: {e}", file=sys.stderr)
        return 1
    print(summary(done))
    return 0


def check_sql(config: SqlConfig) -> int:
    """`--check` (runtime/check.py): what the query or the maintenance pass would run, and on which Spark."""
    c = Checker("logjam-sql")
    spark_url(c, "--spark", config.spark)
    local_dir(c, "--warehouse", config.warehouse)
    if config.query is None and config.trace is None and not (config.compact or config.retention_days
                                                              or config.migrate):
        c.error("give a query, --trace ID, --compact / --retention-days, or --migrate")
    if config.migrate:
        c.would_run(f"move the old layout's table at {table_path(config.warehouse or default_warehouse())} into "
                    f"the Delta table there")
    if config.query is not None:
        c.would_run(f"on {config.spark}, database {config.database}: {config.query}")
    if config.trace is not None:
        days = f"the last {config.days} days" if config.days > 0 else "every day"
        c.would_run(f"find the rows of request or trace id {config.trace!r} in {config.database}.messages, {days}")
    if config.compact:
        c.would_run(f"a maintenance pass of {config.database}.messages (days closed {config.older_than:g}s after "
                    f"they end)")
    if config.retention_days:
        c.would_run(f"delete the days of {config.database}.messages older than {config.retention_days} days")
    return c.report()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, config = parse_config(parser, argv, SqlConfig.from_flags)
    if args.check:
        return check_sql(config)
    if config.query is not None and config.trace is not None:
        parser.error("give a query or --trace, not both")
    if config.migrate_commit_rows < 1:
        parser.error("--migrate-commit-rows must be at least 1")
    if config.migrate and (config.query is not None or config.trace is not None or config.compact
                           or config.retention_days):
        parser.error("--migrate runs alone: no query, --trace, --compact or --retention-days with it")
    if config.query is None and config.trace is None and not (config.compact or config.retention_days
                                                              or config.migrate):
        parser.error("give a query, --trace ID, --compact / --retention-days, or --migrate")
    setup_logging("logjam-sql", config.verbose)
    if not config.verbose:
        logging.getLogger().setLevel(logging.WARNING)
        # pyspark logs every failed query with its JVM stack trace; the one-line error below is enough.
        logging.getLogger("SQLQueryContextLogger").disabled = True
    lifecycle.exit_with(lambda: run(config))


if __name__ == "__main__":
    sys.exit(main())
