"""How a bridge turns one event into a Logjam message (the contract in docs/protocols/, one page per protocol).

Every body gets `@metadata._id`, the event's idempotency key: the client's own when
it sent one (Beats' fingerprint processor writes `@metadata._id`), else what the
bridge passes in its metadata (a position that survives a bridge restart, for the
bridges that store events), else `<instance>:<counter>`, unique to this bridge process.
The key is part of the body bytes, so every resend of a request carries the same key
and the importer drops the copies (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
from dataclasses import dataclass
from array import array
from typing import Any, Sequence

import orjson

from logjam.compression import compress
from logjam.message import Message, MessageBatch, body_from_bytes
from logjam.meta import Compression, now_ms
from logjam.validation import is_valid_app_env


_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_MS = datetime.timedelta(milliseconds=1)
_fromisoformat = datetime.datetime.fromisoformat


def body_and_raw(data: bytes | memoryview) -> tuple[dict[str, Any], bytes | memoryview | None]:
    """`body_from_bytes`, plus `data` itself when the body is that JSON object unchanged (see `EventMapper.add`)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = None
    if value.__class__ is dict:
        return value, data  # a memoryview stays one: the splice copies it once, into the body
    return body_from_bytes(data), None


def parse_timestamp(value: Any) -> int | None:
    """`@timestamp` as epoch milliseconds: ISO 8601 text, or epoch seconds/milliseconds as a number."""
    kind = value.__class__
    if kind is str:  # the common case, once per event: kept to exact, cheap steps
        if not value:
            return None
        try:
            ts = _fromisoformat(value)
        except ValueError:
            try:
                ts = _fromisoformat(value.strip())
            except ValueError:
                return None
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=_UTC)
        ms = (ts - _EPOCH) // _MS
        return ms if ms > 0 else None
    if kind is bool or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        # Beyond year 5138 in seconds means the number was milliseconds already.
        ms = value if value > 1e11 else value * 1000
        return int(ms) if 0 < ms < 2**63 else None
    if isinstance(value, str):
        return parse_timestamp(str(value))
    return None


def _lookup(body: dict[str, Any], path: list[str]) -> Any:
    value: Any = body
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


@dataclass(frozen=True, slots=True)
class Positions:
    """The per-event part of a run's @metadata, in the order the splice's template writes it (so
    that `metadata` and the template give the same bytes): up to two numbered fields (`field1` with `values1[i]`, `field2` with `values2[i]`), then `_id` =
    `key_prefix` + `keys[i]`. Without `keys` the mapper gives its own `<instance>:<counter>`."""

    field1: str = ""
    values1: Sequence[int] = ()
    field2: str = ""
    values2: Sequence[int] = ()
    key_prefix: str = ""
    keys: Sequence[int] | None = None

    def metadata(self, common: dict[str, Any], i: int) -> dict[str, Any]:
        """Event i's @metadata: `common`, its numbered fields, then its key (when `keys` is set)."""
        meta = dict(common)
        if self.field1:
            meta[self.field1] = self.values1[i]
        if self.field2:
            meta[self.field2] = self.values2[i]
        if self.keys is not None:
            meta["_id"] = f"{self.key_prefix}{self.keys[i]}"
        return meta


class Batches:
    """One publish's worth of mapped events: `MessageBatch` runs, a new one when the app-env changes."""

    __slots__ = ("topic", "compression", "batches", "_cur", "n")

    def __init__(self, topic: str, compression: int) -> None:
        self.topic = topic
        self.compression = compression
        self.batches: list[MessageBatch] = []
        self._cur: MessageBatch | None = None
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, app_env: str, body: bytes, created_ms: int) -> None:
        cur = self._cur
        if cur is None or cur.app_env != app_env:
            cur = self._cur = MessageBatch(app_env, self.topic, self.compression)
            self.batches.append(cur)
        cur.bodies.append(compress(self.compression, body) if self.compression else body)
        cur.created_ms.append(created_ms)
        self.n += 1

    def add_packed(self, app_env: str, blob: bytes, lens: Sequence[int], created_ms: Sequence[int]) -> None:
        """Uncompressed bodies already joined (`EventMapper._splice`'s output), as a batch of their own."""
        self.batches.append(MessageBatch(app_env, self.topic, self.compression, created_ms=created_ms, packed=(blob, lens)))
        self._cur = None
        self.n += len(lens)

    def messages(self) -> list[Message]:
        return [m for b in self.batches for m in b.messages()]


class EventMapper:
    def __init__(
        self,
        *,
        app_env: str,
        topic: str,
        app_env_field: str | None = None,
        compression: int = Compression.NONE,
        on_fallback: Any = None,
        instance: str | None = None,
    ) -> None:
        self.app_env = app_env
        self.topic = topic
        self.field_path = app_env_field.split(".") if app_env_field else None
        self.compression = compression
        self._on_fallback = on_fallback
        # 64 random bits: two bridge processes never share a prefix in practice.
        self.instance = instance or secrets.token_hex(8)
        # As JSON string text: `add` writes it straight into the @metadata bytes.
        self._key_prefix = orjson.dumps(f"{self.instance}:")[1:-1]
        self._next_n = 1

    def batches(self) -> Batches:
        return Batches(self.topic, self.compression)

    def app_env_for(self, body: dict[str, Any]) -> str:
        """--app-env-field's value when it is a valid stream name, else --app-env (counted)."""
        if self.field_path is None:
            return self.app_env
        value = _lookup(body, self.field_path)
        if isinstance(value, str) and is_valid_app_env(value):
            return value
        if self._on_fallback is not None:
            self._on_fallback()
        return self.app_env

    def take_keys(self, n: int) -> int:
        """Reserve n consecutive key numbers; returns the first. For a protocol that writes its
        own `@metadata` (bridges/syslog/bridge.py) and must number its keys from the same counter."""
        first = self._next_n
        self._next_n = first + n
        return first

    def _next_key(self) -> str:
        return f"{self.instance}:{self.take_keys(1)}"

    def _with_metadata(self, body: dict[str, Any], metadata: dict[str, Any]) -> None:
        """Set body["@metadata"]: ours merged over the event's, with the idempotency key (never mutates `metadata`)."""
        existing = body.get("@metadata")
        if existing.__class__ is dict and existing:
            merged = {**existing, **metadata}
            key = existing.get("_id")
            if isinstance(key, str) and key:
                merged["_id"] = key  # the client's own key wins: it also covers the client's resends
            elif "_id" not in metadata:
                merged["_id"] = self._next_key()
            body["@metadata"] = merged
        elif "_id" in metadata:
            body["@metadata"] = metadata
        else:
            body["@metadata"] = {**metadata, "_id": self._next_key()}

    def add(
        self,
        out: Batches,
        body: dict[str, Any],
        metadata: dict[str, Any],
        *,
        created_ms: int | None = None,
        app_env: str | None = None,
        raw: bytes | memoryview | None = None,
    ) -> None:
        """Map one event into `out`: @metadata and its key, app-env, created_ms, encoded body.

        `raw`, when given, is the JSON text `body` was parsed from, unchanged. For a
        non-empty object without its own @metadata the body is then that text with
        `,"@metadata":{...}` spliced in before the closing brace: the same JSON as
        re-encoding the dict, without re-encoding the event.
        """
        if raw is not None and body and "@metadata" not in body:
            text = bytes(raw).rstrip()
            if text[-1:] == b"}":
                if "_id" in metadata:
                    meta = orjson.dumps(metadata, default=str)
                else:
                    key = b'"_id":"%b%d"}' % (self._key_prefix, self.take_keys(1))
                    meta = orjson.dumps(metadata, default=str)[:-1] + (b"," + key if metadata else key)
                ts = parse_timestamp(body.get("@timestamp"))
                out.add(app_env or self.app_env_for(body), b'%b,"@metadata":%b}' % (text[:-1], meta),
                        ts or created_ms or now_ms())
                return
        self._with_metadata(body, metadata)
        ts = parse_timestamp(body.get("@timestamp"))
        out.add(app_env or self.app_env_for(body), orjson.dumps(body, default=str), ts or created_ms or now_ms())

    def add_encoded(self, out: Batches, blob: bytes, lens: Sequence[int], created_ms: Sequence[int],
                    *, app_env: str | None = None) -> None:
        """Events a bridge mapped and encoded whole, @metadata and its `_id` in them (`blob`: the
        bodies joined, `lens` their lengths), in order, with their `created_ms` (0: no time, so
        the receive time, as `add` gives). `@timestamp` is not read: the bridge's times are final.

        What `add` gives each body's object with that @metadata, without decoding a body: under
        --app-env (or `app_env`) and uncompressed, the blob is one packed batch as it is; else
        each body is added on its own (parsed only for --app-env-field)."""
        if not lens:
            return
        if not all(created_ms):
            now = now_ms()
            created_ms = array("q", [ms or now for ms in created_ms])
        if app_env is None and self.field_path is None:
            app_env = self.app_env
        if app_env is not None and not self.compression:
            out.add_packed(app_env, blob, lens, created_ms)
            return
        pos = 0
        for size, ms in zip(lens, created_ms):
            body = blob[pos : pos + size]
            pos += size
            out.add(app_env or self.app_env_for(orjson.loads(body)), body, ms)

    def add_payloads(
        self,
        out: Batches,
        payloads: Sequence[bytes | memoryview | None],
        common: dict[str, Any],
        positions: Positions = Positions(),
        *,
        bodies: Sequence[Any] | None = None,
        created_ms: int | None = None,
        app_env: str | None = None,
    ) -> None:
        """Map a run of events as the client sent them (JSON objects, other JSON, text or
        bytes), in order, each with `common` and its `positions` as @metadata: exactly what
        `add` gives each event (tests/test_mapping_splice.py checks it byte for byte).

        `bodies`, when the engine already parsed the payloads, are those values; then
        `payloads[i]` may be None where `bodies[i]` is not the object that text holds.
        Without `positions.keys` events are numbered from this mapper's counter in order."""
        if not payloads:
            return
        created = created_ms or now_ms()  # as `add` would: 0 is no time
        if self._splice_applies(common, positions):
            self._splice(out, payloads, bodies, common, positions, created, app_env)
            return
        for i, payload in enumerate(payloads):
            body, raw = body_and_raw(payload) if bodies is None else (bodies[i], payload)  # type: ignore[arg-type]
            self.add(out, body, positions.metadata(common, i), created_ms=created, app_env=app_env, raw=raw)

    def _splice(self, out: Batches, texts: Sequence[bytes | memoryview], bodies: Sequence[Any] | None,
                common: dict[str, Any], p: Positions, created_ms: int, app_env: str | None) -> None:
        """`add` for each of `texts` (parsed here unless `bodies` are given), faster: the @metadata
        text is written once per run as a template (`_metadata_template`), and the events that
        are plain non-empty objects without @metadata are joined into packed batches; any
        other event goes through `add` on its own, in order.

        This replaced a C validator and splicer (about 240 lines that had to accept exactly
        what orjson accepts): orjson validates, docs/architecture.md has the cost."""
        template = self._metadata_template(common, p)
        f1, f2, keys = bool(p.field1), bool(p.field2), p.keys
        v1, v2 = p.values1, p.values2
        app = app_env or self.app_env
        loads, decode_error, timestamp = orjson.loads, orjson.JSONDecodeError, parse_timestamp
        parts: list[bytes | memoryview] = []
        lens, stamps = array("I"), array("q")
        # The mapper's key counter, held in a local for the run (`add` reads and moves it).
        next_key = self._next_n
        last_ts: Any = None
        last_stamp = created_ms
        for i, raw in enumerate(texts):
            if bodies is None:
                try:
                    body = loads(raw)
                except decode_error:
                    body = None
            else:
                body = bodies[i]
            # `raw` None: the engine parsed the event and its body is not that text's object
            # (a wrapper of text that is not a JSON object, add_payloads' contract): nothing to splice into.
            if raw is None or body.__class__ is not dict or not body or "@metadata" in body:
                if lens:
                    out.add_packed(app, b"".join(parts), lens, stamps)
                    parts, lens, stamps = [], array("I"), array("q")
                single, single_raw = body_and_raw(raw) if bodies is None else (body, raw)
                self._next_n = next_key
                self.add(out, single, p.metadata(common, i), created_ms=created_ms, app_env=app_env, raw=single_raw)
                next_key = self._next_n
                continue
            # As `add` does, whitespace after the closing brace goes; a slice of a memoryview
            # copies nothing. (A dict came from it, so `raw` is not empty; 125 is "}".)
            text = raw[:-1] if raw[-1] == 125 else bytes(raw).rstrip()[:-1]
            if keys is None:
                key = next_key
                next_key += 1
            else:
                key = keys[i]
            if f1:
                meta = template % ((v1[i], v2[i], key) if f2 else (v1[i], key))
            else:
                meta = template % ((v2[i], key) if f2 else key)
            parts.append(text)
            parts.append(meta)
            lens.append(len(text) + len(meta))
            # A shipper stamps a burst of lines read together with the same time: parse it once.
            ts = body.get("@timestamp")
            if ts != last_ts or ts.__class__ is not str:  # (1 == True: only text is reused)
                last_ts, last_stamp = ts, timestamp(ts) or created_ms
            stamps.append(last_stamp)
        self._next_n = next_key
        if lens:
            out.add_packed(app, b"".join(parts), lens, stamps)

    def _metadata_template(self, common: dict[str, Any], p: Positions) -> bytes:
        """`,"@metadata":{common,field1:%d,field2:%d,"_id":"prefix%d"}}` as the JSON `add` writes
        (with `%` escaped in the fixed parts): the same bytes as encoding `p.metadata(common, i)`."""
        pieces = []
        common_text = orjson.dumps(common, default=str)[1:-1]
        if common_text:
            pieces.append(common_text.replace(b"%", b"%%"))
        for field in (p.field1, p.field2):
            if field:
                pieces.append(orjson.dumps(field).replace(b"%", b"%%") + b":%d")
        prefix = orjson.dumps(p.key_prefix)[1:-1] if p.keys is not None else self._key_prefix
        pieces.append(b'"_id":"' + prefix.replace(b"%", b"%%") + b'%d"')
        return b',"@metadata":{' + b",".join(pieces) + b"}}"

    def _splice_applies(self, common: dict[str, Any], p: Positions) -> bool:
        """Whether `_splice` gives what `add` does: it writes uncompressed bodies under --app-env,
        and writes the positions' fields and `_id` after `common` (Python's dict would merge a
        name given twice instead)."""
        if self.compression or self.field_path is not None:
            return False
        if "_id" in common or (p.field1 and p.field1 in common) or (p.field2 and p.field2 in common):
            return False
        return not (p.field1 and p.field1 == p.field2)
