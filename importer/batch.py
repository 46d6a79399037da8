"""The batch stage: group commit. Decoded rows accumulate until the writer is free, bounded by bytes.

At low load a batch is cut `--flush-interval` after its first row, so a row is queryable
about that long (plus one commit) after it arrived. Under load the writer is busy for
a whole commit; meanwhile rows keep accumulating, and the next commit takes everything
that arrived since the last one. Batch size thus follows the load with no tuning, and
a commit's fixed cost (a file per partition, its fsyncs and renames; a whole job for a
remote Spark) is paid once per batch, not per `--batch-rows`. `--batch-bytes` bounds a batch (and so the importer's memory and the
length of a commit); a full batch waits for the writer, and while it waits the importer
stops receiving (the SUB socket fills, and what its high-water mark drops comes back
through replay).

With the C decoder (importer/decode_native.py) the receive stage hands over a drained
chunk's kept messages at once (`add_picks`), and rows are made in C.

Rows are turned into Arrow every CHUNK_ROWS rows, so the Python objects of a large batch
never pile up: a batch is held as compact Arrow chunks.
"""

from __future__ import annotations

import array
import time
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa

from importer.sequence import Position
from importer.decode import BatchBuilder
from importer.decode_native import CHUNK_ROWS, NativeBatchBuilder
from logjam.message import Message
from logjam.raw import RawBatch

DEFAULT_BATCH_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows for one commit, and the per-device positions they (and all before them) cover."""

    table: pa.Table
    mark: Mapping[int, Position] | None
    rows: int
    bytes: int
    opened: float  # time.monotonic() of its first row


class GroupCommit:
    """Accumulates decoded rows; says when a batch is due and cuts it."""

    def __init__(self, builder: BatchBuilder | NativeBatchBuilder, *, flush_interval: float, batch_bytes: int = DEFAULT_BATCH_BYTES,
                 batch_rows: int | None = None) -> None:
        self.builder = builder
        self.flush_interval = flush_interval
        self.batch_bytes = batch_bytes
        self.batch_rows = batch_rows
        self._chunks: list[pa.Table] = []
        self._chunk_bytes = 0
        self._rows = 0
        self._opened: float | None = None

    @property
    def rows(self) -> int:
        return self._rows + len(self.builder)

    @property
    def bytes(self) -> int:
        """Arrow bytes of the finished chunks plus the decompressed bodies not yet turned into Arrow."""
        return self._chunk_bytes + self.builder.body_bytes

    def add(self, msg: Message, ingested_us: int, journal: str | None = None) -> Any:
        """Decode one message into the open batch; returns what `BatchBuilder.add` returns."""
        meta = msg.meta
        return self.add_raw(msg.app_env, msg.topic, msg.body, meta.compression, meta.device, meta.created_ms,
                            meta.seq, ingested_us, journal)

    def add_raw(self, app_env: str, topic: str, frame: bytes, compression: int, device: int, created_ms: int,
                seq: int, ingested_us: int, journal: str | None = None) -> Any:
        """Decode one message, given as its parts, into the open batch; see `BatchBuilder.add_raw`."""
        builder = self.builder
        result = builder.add_raw(app_env, topic, frame, compression, device, created_ms, seq, ingested_us, journal)
        if self._opened is None and len(builder):
            self._opened = time.monotonic()
        if len(builder) >= CHUNK_ROWS:
            self._finish_chunk()
        return result

    def add_picks(self, raw: RawBatch, picks: array.array, ingested_us: int) -> list[tuple[int, str]]:
        """Decode the messages of `raw` that `picks` names into the open batch, in one C call a chunk
        (a `NativeBatchBuilder` only; importer/decode_native.py says what a pick is). Returns (pick
        number, result) for each pick whose result is not None (see `BatchBuilder.add_raw`)."""
        builder = self.builder
        results: list[tuple[int, str]] = []
        k, total = 0, len(picks) // 4
        while k < total:
            k = builder.add_picks(raw, picks, k, ingested_us, results)
            if self._opened is None and len(builder):
                self._opened = time.monotonic()
            if builder.full():
                self._finish_chunk()
        return results

    def _finish_chunk(self) -> None:
        chunk = self.builder.build()
        self.builder.body_bytes = 0
        self._chunks.append(chunk)
        self._chunk_bytes += chunk.nbytes
        self._rows += chunk.num_rows

    def full(self) -> bool:
        return self.bytes >= self.batch_bytes or (self.batch_rows is not None and self.rows >= self.batch_rows)

    def due(self, writer_idle: bool, now: float | None = None) -> bool:
        """A batch is due when it is full, or when the writer is idle and the first row waited `--flush-interval`."""
        if self._opened is None:
            return False
        if self.full():
            return True
        return writer_idle and (now if now is not None else time.monotonic()) - self._opened >= self.flush_interval

    def deadline(self) -> float | None:
        """When the open batch becomes due by age (None when there is none)."""
        return None if self._opened is None else self._opened + self.flush_interval

    def cut(self, mark: Mapping[int, Position] | None) -> Batch | None:
        """The open batch (None if it is empty); a new one starts."""
        if len(self.builder):
            self._finish_chunk()
        opened = self._opened
        self._opened = None
        if not self._rows or opened is None:
            self._chunks.clear()
            self._chunk_bytes = self._rows = 0
            return None
        table = pa.concat_tables(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        batch = Batch(table, mark, self._rows, self._chunk_bytes, opened)
        self._chunks = []
        self._chunk_bytes = self._rows = 0
        return batch
