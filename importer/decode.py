"""Turn Logjam Messages into rows of the `messages` table, column by column, and hand out Arrow tables.

Pure: no sockets, no Spark. Every message becomes exactly one row. A body that cannot
be decompressed or parsed still becomes a row, with `parse_error` saying why and `raw`
holding the frame as received, so nothing is silently dropped.

Rows are kept as one Python list per column (no per-row objects) because this runs once
per message on the importer's hot path; Arrow then builds each column in C.

A body's idempotency key (`@metadata._id`) fills `event_id`; given a `RecentKeys`
(importer/dedupe.py), the builder also drops a message whose key it has seen before in
the same stream, without parsing anything twice.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pyarrow as pa

from logjam.compression import DEFAULT_MAX_DECOMPRESSED, decompress
from logjam.errors import CompressionError
from logjam.message import Message
from importer.dedupe import RecentKeys
from table.event_time import EventWindow, moved_by_stream
from table.schema import ARROW_SCHEMA, TIMESTAMP

# Spark timestamps end with year 9999; later values cannot be stored.
MAX_CREATED_MS = 253_402_300_799_999
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_WRAP = 2**64

# Longer `@metadata._id` values are ignored: a key is an id, not a payload, and each one is kept in memory.
MAX_EVENT_ID_BYTES = 512

# What `BatchBuilder.add` returns for a message whose event id was already seen (no row was added).
DUPLICATE_EVENT = "duplicate_event_id"


def split_app_env(app_env: str) -> tuple[str, str | None]:
    """`app`, `env`: the environment is the part after the last '-' (applications may contain '-')."""
    app, sep, env = app_env.rpartition("-")
    return (app, env) if sep else (app_env, None)


def _text(v: Any) -> str | None:
    if v is None or type(v) is str:
        return v
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is int or type(v) is float:
        return str(v)
    return None  # objects and arrays stay in `body` only


def _int(v: Any) -> int | None:
    if type(v) is int:
        return v if _I64_MIN <= v <= _I64_MAX else None
    if type(v) is str and v.lstrip("-").isdigit():
        try:
            n = int(v)
        except ValueError:  # "--1", digits int() does not read ("²"), or too many of them
            return None
        return n if _I64_MIN <= n <= _I64_MAX else None
    return None


def _float(v: Any) -> float | None:
    if type(v) is float or type(v) is int:
        return float(v)
    if type(v) is str:
        try:
            return float(v)
        except ValueError:
            return None
    return None


def event_id(v: Any) -> str | None:
    """The idempotency key from an `@metadata._id` value: a non-empty string of at most 512 UTF-8 bytes,
    or an integer as its decimal text; anything else is no key (the event is never deduplicated)."""
    if type(v) is str:
        n = len(v)
        # Code points, then bytes only when it matters: at most 4 bytes per code point.
        if 0 < n <= MAX_EVENT_ID_BYTES and (n <= MAX_EVENT_ID_BYTES // 4 or v.isascii()
                                            or len(v.encode()) <= MAX_EVENT_ID_BYTES):
            return v
        return None
    if type(v) is int:
        return str(v)
    return None


def created_us(created_ms: int, ingested_us: int) -> int:
    """A row's created_at in microseconds (native/decode.c's created_us follows it): a created_ms of 0
    (no time) or past year 9999 is replaced by the arrival time. The partition's date is decided
    from it a chunk at a time, in `build` (table/event_time.py)."""
    if created_ms > MAX_CREATED_MS or created_ms == 0:
        created_ms = ingested_us // 1000
    return created_ms * 1000


def stream_key(app_env: str, eid: str) -> str:
    """What the dedupe memory holds for an event id: scoped by stream, so one client's ids never
    suppress another stream's events."""
    return f"{app_env}\0{eid}"


def _host(v: Any) -> str | None:
    # Beats send ECS `host: {"name": ...}`; Logjam agents send a plain string.
    if type(v) is dict:
        return _text(v.get("name") or v.get("hostname"))
    return _text(v)


# OpenTelemetry's SeverityNumber ranges (1-4, 5-8, ... 21-24) by their short names; a number within a
# range (e.g. 10, "INFO2") is given the range's name, which is what queries group by.
_OTEL_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
# RFC 5424's severity keywords, 0..7.
_SYSLOG_LEVELS = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
# Where an id is read from, in order (`_id`): `<x>_id`, the object `<x>` (its `id`) else `<x>.id`, `<x>Id`.
_TRACE_KEYS = ("trace_id", "trace", "trace.id", "traceId")
_SPAN_KEYS = ("span_id", "span", "span.id", "spanId")
# The top-level keys any of the columns below come from but the ones every body is asked for.
_OTHER_KEYS = frozenset(("severity_text", "severity_number", "syslog", *_TRACE_KEYS, *_SPAN_KEYS))
# A trace or span id: hex digits, an even number of them, at most 64 (W3C/OTel ids are 32 and 16).
_HEX_ID = re.compile("(?:[0-9a-fA-F]{2}){1,32}")


def _level(doc: dict[str, Any], v: Any, others: bool = True) -> str | None:
    """`level`, else `log.level` (ECS, nested or dotted), else a string `severity`, else OTLP's
    `severity_text` (non-empty) or its `severity_number` (1..24) as the OTel range's name, else the syslog
    bridge's `syslog.severity` (0..7) as the RFC 5424 keyword. A present value of another type ends the
    search (NULL), as it always did for the first three. `v` is the body's `level` (the caller has it);
    `others`: False when the body has none of _OTHER_KEYS (the last three are then not looked up)."""
    if v is None:
        log = doc.get("log")
        if type(log) is dict:
            v = log.get("level")
        else:
            v = doc.get("log.level")
    if v is None:
        v = doc.get("severity")
        if type(v) is not str:
            return _level_from_numbers(doc) if others else None
    return _text(v)


def _level_from_numbers(doc: dict[str, Any]) -> str | None:
    """The level OTLP and syslog bodies give (see `_level`): they carry no `level` of their own."""
    v = doc.get("severity_text")
    if type(v) is str and v:
        return v
    v = doc.get("severity_number")
    if type(v) is int and 1 <= v <= 24:
        return _OTEL_LEVELS[(v - 1) >> 2]
    syslog = doc.get("syslog")
    if type(syslog) is dict:
        v = syslog.get("severity")
        if type(v) is int and 0 <= v <= 7:
            return _SYSLOG_LEVELS[v]
    return None


def _hex_id(v: Any) -> str | None:
    """A trace or span id as lowercase hex; anything but a string of hex digits is NULL (not kept as
    text: a column of ids should only ever hold ids)."""
    if type(v) is str and _HEX_ID.fullmatch(v) is not None:
        return v.lower()
    return None


def _ids(doc: dict[str, Any]) -> tuple[str | None, str | None]:
    """(trace_id, span_id), each read by `_id`."""
    return _id(doc, _TRACE_KEYS), _id(doc, _SPAN_KEYS)


def _id(doc: dict[str, Any], keys: tuple[str, str, str, str]) -> str | None:
    """`<x>_id`, else `<x>.id` (ECS, nested or dotted, as `log.level`), else `<x>Id` (OTLP/JSON's
    spelling), `keys` naming them for one x. The first of them present and not null is the one
    read, then checked by `_hex_id`."""
    flat, nested, dotted, camel = keys
    v = doc.get(flat)
    if v is None:
        p = doc.get(nested)
        v = p.get("id") if type(p) is dict else doc.get(dotted)
        if v is None:
            v = doc.get(camel)
    return _hex_id(v)


def _sparse(values: dict[int, str], rows: int) -> pa.Array:
    """A string column of `rows` rows from its non-NULL cells by row."""
    if not values:
        return pa.nulls(rows, pa.string())
    cells: list[str | None] = [None] * rows
    for row, v in values.items():
        cells[row] = v
    return pa.array(cells, pa.string())


class BatchBuilder:
    """Accumulates rows; `build()` returns them as one Arrow table and starts a new batch."""

    def __init__(self, max_body: int = DEFAULT_MAX_DECOMPRESSED, dedupe: RecentKeys | None = None,
                 window: EventWindow = EventWindow()) -> None:
        self.max_body = max_body
        self.dedupe = dedupe
        self.window = window
        # Rows filed under the day they arrived, by stream, since `take_out_of_window`: (rows, earliest
        # and latest created_at in microseconds).
        self.out_of_window: dict[str, tuple[int, int, int]] = {}
        self.duplicates = 0
        self._names: dict[str, tuple[str, str | None]] = {}
        self.parse_errors = 0
        self._reset()

    def _reset(self) -> None:
        self._app_env: list[str] = []
        self._app: list[str] = []
        self._env: list[str | None] = []
        self._topic: list[str] = []
        self._device: list[int] = []
        self._seq: list[int] = []
        self._journal: list[str | None] = []
        self._created: list[int] = []
        self._ingested: list[int] = []
        self._body: list[bytes | None] = []
        self._error: list[str | None] = []
        self._raw: list[bytes | None] = []
        self._message: list[str | None] = []
        self._host: list[str | None] = []
        self._level: list[str | None] = []
        self._action: list[str | None] = []
        self._request_id: list[str | None] = []
        # Sparse, by row: most rows have no ids, and a dict spares them two appends.
        self._trace_id: dict[int, str] = {}
        self._span_id: dict[int, str] = {}
        self._protocol: list[str | None] = []
        self._event_id: list[str | None] = []
        self._severity: list[int | None] = []
        self._code: list[int | None] = []
        self._total_time: list[float | None] = []
        # Decompressed body bytes in the open batch: what sizes it in memory and on disk.
        self.body_bytes = 0

    def __len__(self) -> int:
        return len(self._app_env)

    def add(self, msg: Message, ingested_us: int, journal: str | None = None) -> str | None:
        """Append one row for `msg`; see `add_raw`."""
        meta = msg.meta
        return self.add_raw(msg.app_env, msg.topic, msg.body, meta.compression, meta.device, meta.created_ms,
                            meta.seq, ingested_us, journal)

    def add_raw(self, app_env: str, topic: str, frame: bytes, compression: int, device: int, created_ms: int,
                seq: int, ingested_us: int, journal: str | None = None) -> str | None:
        """Append one row; returns the parse error (None when the body parsed), or DUPLICATE_EVENT when the
        body's event id was already seen in this stream (then no row is added). `journal` is the id of the
        device journal the message came from, when the device announced one.

        This runs once per message on the importer's hot path, hence the inlined common cases
        (a string where a string is expected, an int where an int is) before the general helpers.
        """
        error: str | None = None
        doc: Any = None
        body: bytes | None
        try:
            body = decompress(compression, frame, self.max_body) if compression else frame
        except CompressionError as e:
            error = f"{e.reason}: {e}"
            body = None
        else:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                error = f"bad_json: {e}"
                # Keep what arrived readable; the exact bytes are in `raw`.
                body = body.decode("utf-8", "replace").encode()

        # Before anything is appended: a duplicate leaves no trace in the batch.
        md: Any = None
        eid: str | None = None
        if doc.__class__ is dict:
            md = doc.get("@metadata")
            if md.__class__ is dict:
                eid = event_id(md.get("_id"))
                if eid is not None and self.dedupe is not None and self.dedupe.seen(stream_key(app_env, eid)):
                    self.duplicates += 1
                    return DUPLICATE_EVENT

        names = self._names.get(app_env)
        if names is None:
            names = split_app_env(app_env)
            if len(self._names) < 100_000:
                self._names[app_env] = names
        self._app_env.append(app_env)
        self._app.append(names[0])
        self._env.append(names[1])
        self._topic.append(topic)
        self._device.append(device)
        # Stored as a signed 64-bit integer like every Java and Ruby consumer; u64 values past 2**63 wrap.
        self._seq.append(seq - _U64_WRAP if seq > _I64_MAX else seq)
        self._journal.append(journal)
        self._created.append(created_us(created_ms, ingested_us))
        self._ingested.append(ingested_us)
        self._body.append(body)
        self.body_bytes += len(body) if body is not None else len(frame)
        self._error.append(error)
        self._raw.append(frame if error is not None else None)
        if error is not None:
            self.parse_errors += 1
        if doc.__class__ is dict:
            self._typed(doc, md, eid)
        else:
            self._untyped()
        return error

    def _typed(self, doc: dict[str, Any], md: Any, eid: str | None) -> None:
        # The keys of the ids and of OTLP's and syslog's levels are looked up only when the body has
        # one of them: most bodies have none, and one pass over their keys in C costs a third of
        # the eleven lookups (90 against 300 ns, measured on e2e's bodies).
        others = not _OTHER_KEYS.isdisjoint(doc)
        if others:
            trace_id, span_id = _ids(doc)
            if trace_id is not None:
                self._trace_id[len(self._seq) - 1] = trace_id
            if span_id is not None:
                self._span_id[len(self._seq) - 1] = span_id
        get = doc.get
        v = get("message")
        self._message.append(v if v is None or v.__class__ is str else _text(v))
        v = get("host")
        self._host.append(v if v is None or v.__class__ is str else _host(v))
        v = get("level")
        self._level.append(v if v.__class__ is str else _level(doc, v, others))
        v = get("action")
        self._action.append(v if v is None or v.__class__ is str else _text(v))
        v = get("request_id")
        self._request_id.append(v if v is None or v.__class__ is str else _text(v))
        if md.__class__ is dict:
            v = md.get("protocol")
            self._protocol.append(v if v is None or v.__class__ is str else _text(v))
        else:
            self._protocol.append(None)
        self._event_id.append(eid)
        v = get("severity")
        self._severity.append(v if v is None or (v.__class__ is int and _I64_MIN <= v <= _I64_MAX) else _int(v))
        v = get("code")
        self._code.append(v if v is None or (v.__class__ is int and _I64_MIN <= v <= _I64_MAX) else _int(v))
        v = get("total_time")
        self._total_time.append(v if v is None or v.__class__ is float else _float(v))

    def _untyped(self) -> None:
        # trace_id and span_id are sparse: nothing to add for a row without them.
        for column in (self._message, self._host, self._level, self._action, self._request_id, self._protocol,
                       self._event_id, self._severity, self._code, self._total_time):
            column.append(None)

    def build(self) -> pa.Table:
        """The rows added since the last build, as a table with ARROW_SCHEMA; the builder is then empty."""
        app_env = pa.array(self._app_env, pa.string())
        created = pa.array(self._created, pa.int64())
        ingested = pa.array(self._ingested, pa.int64())
        date, moved = self.partition_dates(app_env, created, ingested)
        columns = {
            "app_env": app_env,
            "app": pa.array(self._app, pa.string()),
            "env": pa.array(self._env, pa.string()),
            "topic": pa.array(self._topic, pa.string()),
            "device": pa.array(self._device, pa.int64()),
            "seq": pa.array(self._seq, pa.int64()),
            "journal": pa.array(self._journal, pa.string()),
            "created_at": created.cast(TIMESTAMP),
            "ingested_at": ingested.cast(TIMESTAMP),
            # Every body is valid UTF-8: orjson rejects anything else, and a body that did not
            # parse was decoded with replacement. So the bytes are viewed as strings without
            # validating them again (a cast validates: 3.4 against 0.7 us per 300-byte body).
            "body": pa.array(self._body, pa.binary()).view(pa.string()),
            "parse_error": pa.array(self._error, pa.string()),
            "raw": pa.array(self._raw, pa.binary()),
            "message": pa.array(self._message, pa.string()),
            "host": pa.array(self._host, pa.string()),
            "severity": pa.array(self._severity, pa.int64()),
            "level": pa.array(self._level, pa.string()),
            "action": pa.array(self._action, pa.string()),
            "code": pa.array(self._code, pa.int64()),
            "total_time": pa.array(self._total_time, pa.float64()),
            "request_id": pa.array(self._request_id, pa.string()),
            "trace_id": _sparse(self._trace_id, len(self._seq)),
            "span_id": _sparse(self._span_id, len(self._seq)),
            "protocol": pa.array(self._protocol, pa.string()),
            "event_id": pa.array(self._event_id, pa.string()),
            "original_app_env": pa.nulls(len(self._seq), pa.string()),
            "created_out_of_window": moved,
            "date": date,
        }
        self._reset()
        return pa.Table.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)

    def partition_dates(self, app_env: pa.Array, created: pa.Array, ingested: pa.Array) -> tuple[pa.Array, pa.Array]:
        """The chunk's `date` and `created_out_of_window` columns, in one step (table/event_time.py),
        from int64 microseconds; the rows moved are counted for `take_out_of_window`."""
        date, moved = self.window.dates(created, ingested)
        if moved.null_count < len(moved):
            self._count_moved(app_env, created, moved)
        return date, moved

    def _count_moved(self, app_envs: pa.Array, created: pa.Array, mark: pa.Array) -> None:
        for app_env, (n, low, high) in moved_by_stream(app_envs, created, mark).items():
            seen = self.out_of_window.get(app_env)
            self.out_of_window[app_env] = (n, low, high) if seen is None else \
                (seen[0] + n, min(seen[1], low), max(seen[2], high))

    def take_out_of_window(self) -> dict[str, tuple[int, int, int]]:
        """The rows filed under their arrival day since the last call, by stream; then forgets them."""
        taken, self.out_of_window = self.out_of_window, {}
        return taken
