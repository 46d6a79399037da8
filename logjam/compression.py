"""Body codecs for compression ids 0-3, exactly as real Logjam clients encode them.

- 1 zlib: RFC 1950; gzip (what the Ruby agent sends) is accepted on decode.
- 2 snappy: a raw snappy block, not the framed format.
- 3 lz4: a 4-byte big-endian uncompressed length, then a raw LZ4 block.

Decompression is bounded: sizes are checked before anything is allocated where the
format states them (snappy, lz4) and enforced while inflating where it does not (zlib).
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.block
import snappy

from logjam.errors import CompressionError, DecompressedTooLarge
from logjam.meta import Compression

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024

# 32 + 15: let zlib detect a zlib or a gzip header.
_ZLIB_OR_GZIP = 47
_U32 = struct.Struct(">I")


def compress(method: int, body: bytes) -> bytes:
    """Encode `body` with compression id `method`."""
    if method == Compression.NONE:
        return body
    if method == Compression.ZLIB:
        return zlib.compress(body)
    if method == Compression.SNAPPY:
        return snappy.compress(body)
    if method == Compression.LZ4:
        return _U32.pack(len(body)) + lz4.block.compress(body, store_size=False)
    raise ValueError(f"unknown compression id {method}")


def decompress(method: int, data: bytes, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Decode a body; raises CompressionError (or DecompressedTooLarge) and nothing else."""
    if 0 <= method < len(_DECODERS):
        return _DECODERS[method](data, max_size)
    raise CompressionError(f"unknown compression id {method}", reason="unknown_compression")


# Deflate cannot expand input more than 1032:1, so a body this much smaller than the
# bound can be inflated in one call without a limit; only larger ones need the
# incremental, bounded path.
_DEFLATE_MAX_RATIO = 1032


def _inflate(data: bytes, max_size: int) -> bytes:
    if len(data) * _DEFLATE_MAX_RATIO <= max_size:
        try:
            return zlib.decompress(data, _ZLIB_OR_GZIP)
        except zlib.error as e:
            raise CompressionError(f"zlib: {e}") from None
    d = zlib.decompressobj(_ZLIB_OR_GZIP)
    try:
        out = d.decompress(data, max_size + 1)
    except zlib.error as e:
        raise CompressionError(f"zlib: {e}") from None
    if len(out) > max_size:
        raise DecompressedTooLarge(f"zlib body inflates past {max_size} bytes")
    if not d.eof:
        raise CompressionError("zlib: truncated stream")
    return out


def _snappy_length(data: bytes) -> int:
    """Snappy's preamble: the uncompressed length as a little-endian base-128 varint."""
    result = shift = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result
        shift += 7
    raise CompressionError("snappy: bad length preamble")


def _unsnappy(data: bytes, max_size: int) -> bytes:
    # The preamble says how much the library will allocate: check it first. A preamble
    # that ends within two bytes claims less than 16 KiB, under any realistic bound, so
    # the common case needs no decoding at all.
    if not (max_size >= _TWO_BYTE_VARINT_MAX and len(data) >= 2 and (data[0] < 0x80 or data[1] < 0x80)):
        claimed = _snappy_length(data)
        if claimed > max_size:
            raise DecompressedTooLarge(f"snappy body claims {claimed} bytes, limit is {max_size}")
    try:
        # python-snappy's decompress is this call plus a type check and an exception
        # rename; calling cramjam (its engine) directly saves a tenth of a small body's time.
        return bytes(_snappy_raw(data))
    except Exception as e:  # cramjam raises DecompressionError, but also ValueError/TypeError
        raise CompressionError(f"snappy: {e}") from None


_TWO_BYTE_VARINT_MAX = 2**14 - 1
_snappy_raw = cramjam.snappy.decompress_raw


def _unlz4(data: bytes, max_size: int) -> bytes:
    try:
        (claimed,) = _U32.unpack_from(data)
    except struct.error:
        raise CompressionError("lz4: body shorter than its 4-byte length prefix") from None
    if claimed > max_size:
        raise DecompressedTooLarge(f"lz4 body claims {claimed} bytes, limit is {max_size}")
    try:
        out = lz4.block.decompress(data[4:], uncompressed_size=claimed)
    except lz4.block.LZ4BlockError as e:
        raise CompressionError(f"lz4: {e}") from None
    if len(out) != claimed:
        raise CompressionError(f"lz4: body inflated to {len(out)} bytes, prefix said {claimed}")
    return out


def _identity(data: bytes, max_size: int) -> bytes:
    return data


_DECODERS = (_identity, _inflate, _unsnappy, _unlz4)
