"""Finding the J frames of a Lumberjack stream: a run of back-to-back v2 JSON frames in one call.

Why: a Beats window is one C frame that inflates to thousands of J frames, and reading
each 10-byte header in Python (unpack, bounds checks, three appends) cost more than
everything else the engine does. native/scan.c reads the headers of a whole run and
returns their seqs, payload offsets and payload lengths as arrays; the payloads stay
where they are, in the buffer. `_scan_py` is the same loop in Python (LOGJAM_NATIVE=off,
or no build), and the reference the tests compare the C one against.
"""

from __future__ import annotations

import logging
import struct
from array import array
from typing import Any

from logjam import native as _native

log = logging.getLogger(__name__)

MODULE = "bridges.lumberjack._native_scan"
T_JSON = 0x4A
SCRATCH = 4096  # headers read per C call

_HDR = struct.Struct(">BBII")


def _scan_py(buf: bytes | bytearray, pos: int, end: int, base: int, version: int, max_frame: int,
             seqs: array, offs: array, lens: array) -> int:
    unpack = _HDR.unpack_from
    while end - pos >= 10:
        v, t, seq, length = unpack(buf, pos)
        if v != version or t != T_JSON or length > max_frame or end - pos - 10 < length:
            break
        seqs.append(seq)
        offs.append(pos + 10 - base)
        lens.append(length)
        pos += 10 + length
    return pos


class _NativeScanner:
    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self._scratch = array("I", bytes(4 * 3 * SCRATCH))
        c = ffi.from_buffer("uint32_t[]", self._scratch)
        self._seqs, self._offs, self._lens = c, c + SCRATCH, c + 2 * SCRATCH
        self._next = ffi.new("size_t *")

    def __call__(self, buf: bytes | bytearray, pos: int, end: int, base: int, version: int, max_frame: int,
                 seqs: array, offs: array, lens: array) -> int:
        scratch = self._scratch
        with self.ffi.from_buffer(buf) as cbuf:
            while True:
                n = self.lib.lj_scan_json(cbuf, pos, end, base, version, max_frame,
                                          self._seqs, self._offs, self._lens, SCRATCH, self._next)
                if n:
                    seqs.extend(scratch[0:n])
                    offs.extend(scratch[SCRATCH : SCRATCH + n])
                    lens.extend(scratch[2 * SCRATCH : 2 * SCRATCH + n])
                pos = self._next[0]
                if n < SCRATCH:
                    return pos


def scanner(native: bool = True) -> Any:
    """`scan(buf, pos, end, base, version, max_frame, seqs, offs, lens) -> next pos`: appends
    each whole J frame's seq, payload offset (from `base`) and payload length, for the run of
    J frames at buf[pos:end]. C when LOGJAM_NATIVE allows it and it was built;
    `native=False` asks for the Python loop whatever the switch says."""
    built = _native.load(MODULE) if native else None
    return _NativeScanner(*built) if built is not None else _scan_py
