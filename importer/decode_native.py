"""The importer's decode stage in C: a drained chunk of messages to rows in one call (native/decode.c).

`NativeBatchBuilder` is a `BatchBuilder` (importer/decode.py) whose columns live in C. The
receive stage hands it the messages it keeps as picks, 4 numbers each (the message's index
in its `RawBatch`, and the numbers of its app-env, topic and journal names, from
`name_id`), and one `lj_dec_run` turns them into rows. importer/decode.py stays the
reference: a message C does not decode exactly as it would (a compressed body, a parse
error, a float to be written as text, an escaped key...) stops the run, is decoded by a
`BatchBuilder` and its row is appended to the C columns cell by cell, and the run goes on.
So the rows and their order are the reference's (tests/test_importer_decode_native.py
compares the tables, and a Hypothesis property arbitrary frames).

Event ids are deduplicated as the reference does, in order: C asks the key memory about each
row's key as it makes the row (native/dedupe.c, `NativeRecentKeys` here, importer/dedupe.py's
`RecentKeys` in C), and a row whose key it remembers is no row; a deferred message asks the
same memory from the reference. `recent_keys()` makes the memory an importer keeps.

`NativePicker` is the receive stage's loop over a chunk already in sequence (the picks
above, from the messages' app-env and topic bytes) in C, native/pick.c; importer/receive.py
fills its tables and stays the reference for what is picked.

`NativeBatchBuilder.load()` is None when LOGJAM_NATIVE is off or the module was not built;
the importer then runs the Python path.
"""

from __future__ import annotations

import array
from typing import Any, Iterable

import pyarrow as pa

from importer.decode import DUPLICATE_EVENT, BatchBuilder
from importer.dedupe import DEFAULT_CAPACITY, RecentKeys
from logjam import native as _native
from logjam.compression import DEFAULT_MAX_DECOMPRESSED
from logjam.raw import RawBatch
from table.event_time import EventWindow
from table.schema import ARROW_SCHEMA, TIMESTAMP

MODULE = "importer._native_decode"

CHUNK_ROWS = 8192  # importer/batch.py's; a chunk is built when it is full
# Names kept in C (and here) before they are dropped and numbered again (`tidy_names`).
MAX_NAMES = 100_000

# Column numbers as native/decode.h has them, with the reference's list for each.
_STRINGS = (("app_env", "_app_env"), ("app", "_app"), ("env", "_env"), ("topic", "_topic"),
            ("journal", "_journal"), ("body", "_body"), ("parse_error", "_error"), ("raw", "_raw"),
            ("message", "_message"), ("host", "_host"), ("level", "_level"), ("action", "_action"),
            ("request_id", "_request_id"), ("protocol", "_protocol"), ("event_id", "_event_id"),
            ("trace_id", "_trace_id"), ("span_id", "_span_id"))
_NUMBERS = (("device", "_device"), ("seq", "_seq"), ("created_at", "_created"), ("ingested_at", "_ingested"),
            ("severity", "_severity"), ("code", "_code"), ("total_time", "_total_time"))
_BINARY = {"body": pa.string(), "raw": pa.binary()}  # body: valid UTF-8 (see BatchBuilder.build)
_ALWAYS = {"device", "seq", "created_at", "ingested_at"}  # never NULL
_TYPES = {"created_at": TIMESTAMP, "ingested_at": TIMESTAMP, "total_time": pa.float64()}

DONE, DEFER, FULL, NOMEM = 0, 1, 2, 3


class NativeRecentKeys:
    """importer/dedupe.py's `RecentKeys` (the same methods and answers) in C, native/dedupe.c, where
    native/decode.c asks it about each row without Python. Keys are str, held as their UTF-8 bytes."""

    __slots__ = ("capacity", "_ffi", "_lib", "_dd")

    def __init__(self, built: tuple[Any, Any], capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self._ffi, self._lib = built
        dd = self._lib.lj_dd_new(capacity)
        if dd == self._ffi.NULL:
            raise MemoryError(f"lj_dd_new({capacity})")
        self._dd = self._ffi.gc(dd, self._lib.lj_dd_free)
        self.capacity = capacity

    def seen(self, key: str) -> bool:
        text = key.encode("utf-8", "surrogatepass")
        got = self._lib.lj_dd_seen(self._dd, text, len(text))
        if got < 0:
            raise MemoryError("lj_dd_seen")
        return bool(got)

    def extend(self, keys: Iterable[str]) -> int:
        seen = self.seen
        return sum(1 for key in keys if not seen(key))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        text = key.encode("utf-8", "surrogatepass")
        return bool(self._lib.lj_dd_contains(self._dd, text, len(text)))

    def __len__(self) -> int:
        return int(self._lib.lj_dd_len(self._dd))


def recent_keys(capacity: int = DEFAULT_CAPACITY) -> RecentKeys | NativeRecentKeys:
    """The importer's key memory: in C when LOGJAM_NATIVE allows and the module is built, else the twin."""
    built = _native.load(MODULE)
    return NativeRecentKeys(built, capacity) if built is not None else RecentKeys(capacity)


class NativeBatchBuilder:
    """A BatchBuilder whose rows are made in C, a chunk of picks at a time; see the module docstring."""

    native = True

    def __init__(self, built: tuple[Any, Any], max_body: int = DEFAULT_MAX_DECOMPRESSED,
                 dedupe: RecentKeys | NativeRecentKeys | None = None, cap: int = CHUNK_ROWS,
                 window: EventWindow = EventWindow()) -> None:
        self._ffi, self._lib = built
        d = self._lib.lj_dec_new(cap)
        if d == self._ffi.NULL:
            raise MemoryError("lj_dec_new")
        self._d = self._ffi.gc(d, self._lib.lj_dec_free)
        if isinstance(dedupe, RecentKeys):  # the twin's keys, oldest first, into one C can ask
            native_keys = NativeRecentKeys(built, dedupe.capacity)
            native_keys.extend(dedupe.oldest_first())
            dedupe = native_keys
        if dedupe is not None:
            d.dedupe = dedupe._dd
        # The reference, for the messages C defers; its counters are this builder's.
        self.py = BatchBuilder(max_body, dedupe, window)
        self._names: dict[str, int] = {}
        self.generation = 0  # moves on when names are numbered again
        self._raw: RawBatch | None = None
        self._raw_c: tuple[Any, Any, Any] | None = None

    @classmethod
    def load(cls, max_body: int = DEFAULT_MAX_DECOMPRESSED, dedupe: RecentKeys | NativeRecentKeys | None = None,
             cap: int = CHUNK_ROWS, window: EventWindow = EventWindow()) -> NativeBatchBuilder | None:
        built = _native.load(MODULE)
        return cls(built, max_body, dedupe, cap, window) if built is not None else None

    # The reference's counters and key memory are this builder's.
    dedupe = property(lambda self: self.py.dedupe)
    duplicates = property(lambda self: self.py.duplicates)
    parse_errors = property(lambda self: self.py.parse_errors)
    window = property(lambda self: self.py.window)

    def take_out_of_window(self) -> dict[str, tuple[int, int, int]]:
        return self.py.take_out_of_window()

    @property
    def body_bytes(self) -> int:
        return int(self._d.body_bytes)

    @body_bytes.setter
    def body_bytes(self, value: int) -> None:
        self._d.body_bytes = value

    def __len__(self) -> int:
        return int(self._d.rows)

    def full(self) -> bool:
        """The open chunk takes no more rows: build it."""
        return self._d.rows >= self._d.cap or self._d.stop == FULL

    # ---------------------------------------------------------------- names

    def name_id(self, name: str) -> int:
        """The number picks use for `name` (an app-env, topic or journal)."""
        n = self._names.get(name)
        if n is None:
            text = name.encode()
            n = self._lib.lj_dec_name(self._d, text, len(text))
            if n < 0:
                raise MemoryError("lj_dec_name")
            self._names[name] = n
        return n

    def tidy_names(self) -> bool:
        """Between chunks of picks: forget every name when there are many (the caller then asks again)."""
        if len(self._names) < MAX_NAMES:
            return False
        self._lib.lj_dec_names_clear(self._d)
        self._names.clear()
        self.generation += 1
        return True

    # ---------------------------------------------------------------- rows

    add = BatchBuilder.add  # one message by its parts, through add_raw below

    def add_raw(self, app_env: str, topic: str, frame: bytes, compression: int, device: int, created_ms: int,
                seq: int, ingested_us: int, journal: str | None = None) -> str | None:
        """One message by the reference (importer/decode.py), its row appended to the C columns."""
        py = self.py
        result = py.add_raw(app_env, topic, frame, compression, device, created_ms, seq, ingested_us, journal)
        if result is DUPLICATE_EVENT:
            return result
        lib, d = self._lib, self._d
        for col, (_, attr) in enumerate(_STRINGS):
            cells = getattr(py, attr)
            v = cells[0] if cells.__class__ is list else cells.get(0)  # trace_id, span_id: sparse (a dict)
            text = v if v is None or v.__class__ is bytes else v.encode()
            if lib.lj_dec_put_str(d, col, text if text is not None else self._ffi.NULL,
                                  len(text) if text is not None else -1):
                raise MemoryError("lj_dec_put_str")
        for col, (name, attr) in enumerate(_NUMBERS):
            v = getattr(py, attr)[0]
            put = lib.lj_dec_put_float if name == "total_time" else lib.lj_dec_put_int
            if put(d, col, v if v is not None else 0, v is not None):
                raise MemoryError("lj_dec_put")
        lib.lj_dec_end_row(d, py.body_bytes)
        py._reset()
        return result

    def add_picks(self, raw: RawBatch, picks: array.array, start: int, ingested_us: int,
                  results: list[tuple[int, str]]) -> int:
        """Rows for picks[4*start:] until they are all rows or the chunk is full; returns the
        next pick. (k, result) goes to `results` for each pick whose result is not None (a
        parse error, DUPLICATE_EVENT), as `add_raw` returns it."""
        ffi, lib, d = self._ffi, self._lib, self._d
        data, pos, meta = self._raw_columns(raw)
        total = len(picks) // 4
        ptr = ffi.from_buffer("int64_t[]", picks)
        k = start
        while k < total:
            done = lib.lj_dec_run(d, data, len(raw.data), pos, meta, raw.n, ptr + 4 * k, total - k, ingested_us)
            if d.ndups:
                self.py.duplicates += d.ndups
                results.extend((k + j, DUPLICATE_EVENT) for j in ffi.unpack(d.dups, d.ndups))
            k += done
            stop = d.stop
            if stop == DEFER:
                self._defer(raw, picks, k, ingested_us, results)
                k += 1
                if d.rows >= d.cap:
                    break
            elif stop == FULL:
                break
            elif stop == NOMEM:
                raise MemoryError("lj_dec_run")
        return k

    def _raw_columns(self, raw: RawBatch) -> tuple[Any, Any, Any]:
        """raw's buffers as C pointers, kept while the same RawBatch is worked on."""
        if raw is not self._raw or self._raw_c is None:
            pos = raw.pos if isinstance(raw.pos, array.array) else array.array("I", raw.pos)
            meta = raw.meta if isinstance(raw.meta, array.array) else array.array("Q", raw.meta)
            ffi = self._ffi
            self._raw_c = (ffi.from_buffer("uint8_t[]", raw.data), ffi.from_buffer("uint32_t[]", pos),
                           ffi.from_buffer("uint64_t[]", meta), pos, meta)  # type: ignore[assignment]
            self._raw = raw
        return self._raw_c[:3]  # type: ignore[index]

    def _defer(self, raw: RawBatch, picks: array.array, k: int, ingested_us: int,
               results: list[tuple[int, str]]) -> None:
        """Pick k by the reference."""
        i = picks[4 * k]
        p, m = 6 * i, 4 * i
        pos, meta = raw.pos, raw.meta
        app_env = raw.data[pos[p] : pos[p] + pos[p + 1]].decode("utf-8", "replace")
        topic = raw.data[pos[p + 2] : pos[p + 2] + pos[p + 3]].decode("utf-8", "replace")
        journal = self._name(picks[4 * k + 3])
        frame = raw.data[pos[p + 4] : pos[p + 4] + pos[p + 5]]
        result = self.add_raw(app_env, topic, frame, meta[m], meta[m + 1], meta[m + 2], meta[m + 3], ingested_us,
                              journal)
        if result is not None:
            results.append((k, result))

    def _name(self, n: int) -> str | None:
        if n < 0:
            return None
        return self._ffi.buffer(self._d.name[n], self._d.name_len[n])[:].decode()

    def build(self) -> pa.Table:
        """The rows added since the last build, as a table with ARROW_SCHEMA (as BatchBuilder.build)."""
        ffi, d = self._ffi, self._d
        rows = int(d.rows)
        bits = (rows + 7) // 8
        columns: dict[str, pa.Array] = {}
        for col, (name, _) in enumerate(_STRINGS):
            s = d.s[col]
            offsets = _copy(ffi, s.offsets, 4 * (rows + 1))
            data = _copy(ffi, s.data, s.offsets[rows]) if rows else b""
            columns[name] = pa.Array.from_buffers(_BINARY.get(name, pa.string()), rows,
                                                  [pa.py_buffer(_copy(ffi, s.valid, bits)), pa.py_buffer(offsets),
                                                   pa.py_buffer(data)], null_count=-1)
        for col, (name, _) in enumerate(_NUMBERS):
            n = d.n[col]
            valid = None if name in _ALWAYS else pa.py_buffer(_copy(ffi, n.valid, bits))
            columns[name] = pa.Array.from_buffers(_TYPES.get(name, pa.int64()), rows,
                                                  [valid, pa.py_buffer(_copy(ffi, n.values, 8 * rows))],
                                                  null_count=0 if valid is None else -1)
        columns["date"], columns["created_out_of_window"] = self.py.partition_dates(
            columns["app_env"], columns["created_at"].cast(pa.int64()), columns["ingested_at"].cast(pa.int64()))
        columns["original_app_env"] = pa.nulls(rows, pa.string())
        self._lib.lj_dec_reset(d)
        return pa.Table.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def _copy(ffi: Any, pointer: Any, size: int) -> bytes:
    return ffi.buffer(pointer, size)[:] if size else b""


class NativePicker:
    """Picks for a chunk already in sequence, in C (native/pick.c): one call per run of messages
    whose app-env and topic are registered. Registered names mirror the receiver's caches
    (importer/receive.py `Receiver._stream`, `_topic`), numbered as `builder.name_id` numbers them."""

    def __init__(self, builder: NativeBatchBuilder) -> None:
        self._builder = builder
        self._ffi, self._lib = ffi, lib = builder._ffi, builder._lib
        t = lib.lj_pick_new()
        if t == ffi.NULL:
            raise MemoryError("lj_pick_new")
        self._t = ffi.gc(t, lib.lj_pick_free)
        self._result = ffi.new("lj_pick_result_t *")
        self._slot_names: list[str] = []  # per stream slot: its name, for the row counts

    def clear(self) -> None:
        """Forget every name (the builder numbered them again)."""
        self._lib.lj_pick_clear(self._t)
        self._slot_names.clear()

    def stream(self, app_env: bytes, name: str, keeps: bool, number: int) -> None:
        if self._lib.lj_pick_stream(self._t, app_env, len(app_env), number, keeps) < 0:
            raise MemoryError("lj_pick_stream")
        self._slot_names.append(name)

    def topic(self, topic: bytes, number: int) -> None:
        if self._lib.lj_pick_topic(self._t, topic, len(topic), number) < 0:
            raise MemoryError("lj_pick_topic")

    def holds(self, raw: RawBatch, app_env: bytes) -> bool:
        """Whether a message of `raw` has exactly this app-env (the heartbeat's): only the app-env
        frames are compared, not every byte of the chunk searched."""
        data, pos, _ = self._builder._raw_columns(raw)
        return self._lib.lj_pick_find(data, len(raw.data), pos, raw.n, app_env, len(app_env)) < raw.n

    def run(self, raw: RawBatch, start: int, journal: int, picks: array.array, rows: dict[str, int]) -> tuple[int, int]:
        """Picks raw's messages from `start` on, appended to `picks`, with a row counted per pick in
        `rows` (by stream name), until a message with a name not registered; returns (its index, or
        raw.n when all are done; the messages skipped as other workers' streams)."""
        ffi, lib, t = self._ffi, self._lib, self._t
        data, pos, _ = self._builder._raw_columns(raw)
        at = len(picks)
        picks.frombytes(bytes(32 * (raw.n - start)))  # room for 4 numbers a message
        with ffi.from_buffer("int64_t[]", picks) as out:
            stop = lib.lj_pick_run(t, data, len(raw.data), pos, raw.n, start, journal, out + at)
        r = self._result
        lib.lj_pick_result(t, r)
        del picks[at + 4 * r.picks :]
        names = self._slot_names
        for k in range(r.touched):
            slot = r.slots[k]
            name = names[slot]
            rows[name] = rows.get(name, 0) + r.counts[slot]
        return stop, r.skipped
