"""Rows of the `messages` table for tests and benchmarks of its Delta maintenance, appended as importers do.

`rows` makes a batch of one partition with the table's columns (table/schema.py) and the
given seqs of one device; `append` commits it through table/delta.py's `Writer`, one commit
per batch, as an importer does.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from table import delta
from table.schema import ARROW_SCHEMA, DOC_ARROW_TYPE

EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def rows(app_env: str, date: dt.date, seqs: range | list[int], device: int = 1, body_bytes: int = 64) -> pa.Table:
    """One batch of `app_env`'s rows filed under `date`, `seq` from `seqs`, `created_at` descending."""
    n = len(seqs)
    seq = pa.array(list(seqs), pa.int64())
    created = [EPOCH + dt.timedelta(milliseconds=s) for s in reversed(list(seqs))]
    values = {f.name: pa.nulls(n, f.type) for f in ARROW_SCHEMA}
    values.update({
        "app_env": pa.array([app_env] * n), "topic": pa.array(["logs.test"] * n), "seq": seq,
        "device": pa.array([device] * n, pa.int64()), "date": pa.array([date] * n, pa.date32()),
        "created_at": pa.array(created, ARROW_SCHEMA.field("created_at").type),
        "ingested_at": pa.array([EPOCH] * n, ARROW_SCHEMA.field("ingested_at").type),
        "body": pa.array([f"{app_env} {s} ".ljust(body_bytes, "x") for s in seqs]),
    })
    table = pa.table([values[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)
    return delta.with_doc(table, pa.nulls(n, DOC_ARROW_TYPE))


def append(writer: delta.Writer, batch: pa.Table) -> int:
    """Commit `batch` as one untracked append (no app transaction); returns the rows committed."""
    return writer.append(batch, pa.nulls(batch.num_rows, pa.string()), {})
