"""A run of syslog messages as the event bodies `map_run` (bridge.py) sends: parse, JSON, @metadata.

Why: parsing each message into a dict (parse.py) and encoding it with orjson was about half
of the bridge's CPU per event. native/syslog.c writes those same bytes for a whole run in one
call, for the messages it takes: well-formed UTF-8 RFC 5424 with a whole header, a `-` or RFC
3339 TIMESTAMP and structured data without repeats, which is what rsyslog, syslog-ng and
logger send in RFC 5424. Every other message (RFC 3164 among them) it leaves to the Python
path, `one`, which handles everything: parse.py's body, orjson, the template. The C writes
what `one` writes, byte for byte (tests/test_syslog_native.py compares them on generated
messages); it changes speed only, and LOGJAM_NATIVE=off (or no build) runs `one` for all.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from bridges.syslog.parse import parse_timed
from logjam import native as _native

MODULE = "bridges.syslog._native_syslog"
FIXED_ROOM = 512 + 48  # per message, beside 14 bytes per byte of text: native/syslog.c's bound


class Metadata(NamedTuple):
    """The @metadata text of a run around its numbers: `pre`, [TXNR, `mid`,] key number, `post`.
    A NamedTuple: one is made per run, and a UDP run can be a datagram or two."""

    pre: bytes
    mid: bytes
    post: bytes
    relp: bool

    @classmethod
    def of(cls, common: dict[str, Any], instance: str, relp: bool) -> "Metadata":
        """`common` with `txnr` (RELP) and `_id` `<instance>:<n>`, as `EventMapper.add` writes them."""
        head = orjson.dumps(common, default=str)[:-1]  # `{...` of the common part
        sep = b"," if len(head) > 1 else b""
        if relp:
            return cls(b',"@metadata":' + head + sep + b'"txnr":', b',"_id":"' + _prefix(instance), b'"}}', True)
        return cls(b',"@metadata":' + head + sep + b'"_id":"' + _prefix(instance), b"", b'"}}', False)

    @property
    def template(self) -> bytes:
        """The same as a %-template: `template % key`, or `template % (txnr, key)` in RELP."""
        pre, mid = self.pre.replace(b"%", b"%%"), self.mid.replace(b"%", b"%%")
        return pre + (b"%d" + mid if self.relp else b"") + b"%d" + self.post


@functools.lru_cache(maxsize=16)
def _prefix(instance: str) -> bytes:
    """`<instance>:` inside a JSON string."""
    return orjson.dumps(f"{instance}:")[1:-1]


def one(raw: bytes, received_ms: int, meta: Metadata, key: int, txnr: int | None) -> tuple[bytes, int]:
    """The Python path for one message: its event text (body, then @metadata) and its time."""
    body, ms = parse_timed(raw, received_ms)
    return orjson.dumps(body)[:-1] + meta.template % (key if txnr is None else (txnr, key)), ms or received_ms


class NativeEncoder:
    """native/syslog.c over a run; the messages it leaves are mapped by `one`, in place."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self._grow(1 << 20)
        self._scratch(1024)

    def _grow(self, size: int) -> None:
        self._out = bytearray(size)
        self._cout = self.ffi.from_buffer("uint8_t[]", self._out)

    def _scratch(self, n: int) -> None:
        """Room for the lengths and times of n messages, their C views made once."""
        self._lens, self._stamps = array("I", bytes(4 * n)), array("q", bytes(8 * n))
        self._clens = self.ffi.from_buffer("uint32_t[]", self._lens)
        self._cstamps = self.ffi.from_buffer("int64_t[]", self._stamps)

    def __call__(self, raws: Sequence[bytes], received_ms: int, meta: Metadata, key: int,
                 txnrs: Sequence[int] | None) -> tuple[bytes, array, array]:
        """(the events' texts joined, their lengths, their times), as `one` for each would give."""
        blob, lens, stamps = self.c_part(raws, received_ms, meta, key, txnrs)
        if 0 in lens:
            blob = self._fill(blob, raws, received_ms, meta, key, txnrs, lens, stamps)
        return blob, lens, stamps

    def c_part(self, raws: Sequence[bytes], received_ms: int, meta: Metadata, key: int,
               txnrs: Sequence[int] | None) -> tuple[bytes, array, array]:
        """What the C writes alone: the texts of the messages it took, and length 0 for the others."""
        ffi, n = self.ffi, len(raws)
        data = b"".join(raws)
        need = 14 * len(data) + n * (FIXED_ROOM + len(meta.pre) + len(meta.mid) + len(meta.post))
        if need > len(self._out):
            self._grow(max(need, 2 * len(self._out)))
        if n > len(self._lens):
            self._scratch(max(n, 2 * len(self._lens)))
        c_txnrs = ffi.NULL if txnrs is None else ffi.from_buffer("int64_t[]", array("q", txnrs))
        used = self.lib.lj_syslog_map(
            ffi.from_buffer("uint8_t[]", data), ffi.from_buffer("uint32_t[]", array("I", map(len, raws))), n,
            meta.pre, len(meta.pre), meta.mid, len(meta.mid), meta.post, len(meta.post), c_txnrs, key, received_ms,
            self._cout, len(self._out), self._clens, self._cstamps)
        return memoryview(self._out)[:used].tobytes(), self._lens[:n], self._stamps[:n]

    @staticmethod
    def _fill(blob: bytes, raws: Sequence[bytes], received_ms: int, meta: Metadata, key: int,
              txnrs: Sequence[int] | None, lens: array, stamps: array) -> bytes:
        """The C's texts with each message it left (length 0) mapped by `one` in its place."""
        parts: list[bytes] = []
        pos = 0
        for i, size in enumerate(lens):
            if size:
                parts.append(blob[pos:pos + size])
                pos += size
            else:
                text, stamps[i] = one(raws[i], received_ms, meta, key + i, None if txnrs is None else txnrs[i])
                lens[i] = len(text)
                parts.append(text)
        return b"".join(parts)


_encoder: list[NativeEncoder | None] = []  # resolved once per process: this runs for every run


def native() -> NativeEncoder | None:
    """The C encoder when LOGJAM_NATIVE allows it and it was built, else None (the Python path).
    Read once per process, as every process reads the switch at start."""
    if not _encoder:
        built = _native.load(MODULE)
        _encoder.append(NativeEncoder(*built) if built is not None else None)
    return _encoder[0]
