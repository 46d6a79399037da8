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

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bridges.syslog.parse import parse_timed
from logjam import native as _native

MODULE = "bridges.syslog._native_syslog"
FIXED_ROOM = 512 + 48  # per message, beside 14 bytes per byte of text: native/syslog.c's bound


@dataclass(frozen=True, slots=True)
class Metadata:
    """The @metadata text of a run around its numbers: `pre`, [TXNR, `mid`,] key number, `post`."""

    pre: bytes
    mid: bytes
    post: bytes
    template: bytes  # the same as a %-template: `template % key` or `template % (txnr, key)`

    @classmethod
    def of(cls, common: dict[str, Any], instance: str, relp: bool) -> "Metadata":
        """`common` with `txnr` (RELP) and `_id` `<instance>:<n>`, as `EventMapper.add` writes them."""
        prefix = orjson.dumps(f"{instance}:")[1:-1]
        head = orjson.dumps(common, default=str)[:-1]  # `{...` of the common part
        sep = b"," if len(head) > 1 else b""
        if relp:
            pre, mid = b',"@metadata":' + head + sep + b'"txnr":', b',"_id":"' + prefix
        else:
            pre, mid = b',"@metadata":' + head + sep + b'"_id":"' + prefix, b""
        post = b'"}}'
        template = pre.replace(b"%", b"%%") + (b"%d" + mid.replace(b"%", b"%%") if relp else b"") + b"%d" + post
        return cls(pre, mid, post, template)


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

    def _grow(self, size: int) -> None:
        self._out = bytearray(size)
        self._cout = self.ffi.from_buffer("uint8_t[]", self._out)

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
        lens, out_lens, stamps = array("I", map(len, raws)), array("I", bytes(4 * n)), array("q", bytes(8 * n))
        c_txnrs = ffi.NULL if txnrs is None else ffi.from_buffer("int64_t[]", array("q", txnrs))
        used = self.lib.lj_syslog_map(
            ffi.from_buffer("uint8_t[]", data), ffi.from_buffer("uint32_t[]", lens), n, meta.pre, len(meta.pre),
            meta.mid, len(meta.mid), meta.post, len(meta.post), c_txnrs, key, received_ms, self._cout,
            len(self._out), ffi.from_buffer("uint32_t[]", out_lens), ffi.from_buffer("int64_t[]", stamps))
        return memoryview(self._out)[:used].tobytes(), out_lens, stamps

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


_encoders: dict[str, NativeEncoder | None] = {}


def native() -> NativeEncoder | None:
    """The C encoder when LOGJAM_NATIVE allows it and it was built, else None (the Python path)."""
    mode = _native.mode()
    if mode not in _encoders:
        built = _native.load(MODULE)
        _encoders[mode] = NativeEncoder(*built) if built is not None else None
    return _encoders[mode]
