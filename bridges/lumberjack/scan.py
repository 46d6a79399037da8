"""Finding the J frames of a Lumberjack stream: a run of back-to-back v2 JSON frames in one call.

Why: a Beats window is one C frame that inflates to thousands of J frames, and reading
each 10-byte header in Python (unpack, bounds checks, three appends) cost more than
everything else the engine does. `scan_json_frames` reads the headers of a whole run in C
and returns their seqs, payload offsets and payload lengths as arrays; the payloads stay
where they are, in the buffer. `_scan_py` is the same loop in Python, for machines
without a compiler, and the reference the tests compare the C one against.
"""

from __future__ import annotations

import logging
import struct
from array import array
from typing import Any

from logjam.native_build import load_module

log = logging.getLogger(__name__)

T_JSON = 0x4A
SCRATCH = 4096  # headers read per C call

_HDR = struct.Struct(">BBII")

CDEF = """
int lj_scan_json(const unsigned char *buf, size_t pos, size_t end, size_t base, unsigned char version,
                 uint32_t max_frame, uint32_t *seqs, uint32_t *offs, uint32_t *lens, int cap, size_t *next);
"""

SOURCE = r"""
#include <stdint.h>
#include <stddef.h>

static uint32_t lj_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Whole J frames of `version` from buf[pos:end], up to cap of them. Stops at anything else:
   another frame type or version, a frame larger than max_frame (Python raises for it), or a
   frame that has not fully arrived. Offsets are from buf + base. */
int lj_scan_json(const unsigned char *buf, size_t pos, size_t end, size_t base, unsigned char version,
                 uint32_t max_frame, uint32_t *seqs, uint32_t *offs, uint32_t *lens, int cap, size_t *next)
{
    int n = 0;
    while (n < cap && end - pos >= 10 && buf[pos] == version && buf[pos + 1] == 0x4A) {
        uint32_t len = lj_be32(buf + pos + 6);
        if (len > max_frame || end - pos - 10 < len) break;
        seqs[n] = lj_be32(buf + pos + 2);
        offs[n] = (uint32_t)(pos + 10 - base);
        lens[n] = len;
        n++;
        pos += 10 + (size_t)len;
    }
    *next = pos;
    return n;
}
"""


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


_scanner: list[Any] = []


def scanner(native: bool = True) -> Any:
    """`scan(buf, pos, end, base, version, max_frame, seqs, offs, lens) -> next pos`: appends
    each whole J frame's seq, payload offset (from `base`) and payload length, for the run of
    J frames at buf[pos:end]. C when it can be built."""
    if not native:
        return _scan_py
    if not _scanner:
        built = load_module("_logjam_lumberjack_scan", CDEF, SOURCE, log)
        _scanner.append(_NativeScanner(*built) if built is not None else _scan_py)
    return _scanner[0]
