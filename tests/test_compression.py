"""Body codec vectors: each method as real clients encode it, and every way it breaks."""

import gzip
import struct
import zlib

import lz4.block
import pytest
import snappy
from hypothesis import given, settings, strategies as st

from logjam.compression import compress, decompress
from logjam.errors import CompressionError, DecompressedTooLarge, ProtocolError
from logjam.meta import Compression

BODY = b'{"action":"Users#show","code":200,"message":"' + b"x" * 500 + b'"}'
METHODS = list(Compression)


@pytest.mark.parametrize("method", METHODS)
def test_round_trip(method):
    assert decompress(method, compress(method, BODY)) == BODY


@pytest.mark.parametrize("method", METHODS)
def test_empty_body(method):
    assert decompress(method, compress(method, b"")) == b""


def test_zlib_body_from_zlib():
    assert decompress(Compression.ZLIB, zlib.compress(BODY, 9)) == BODY


def test_gzip_body_like_the_ruby_agent():
    assert decompress(Compression.ZLIB, gzip.compress(BODY)) == BODY


def test_snappy_is_raw_block():
    assert compress(Compression.SNAPPY, BODY) == snappy.compress(BODY)
    assert decompress(Compression.SNAPPY, snappy.compress(BODY)) == BODY


def test_lz4_is_big_endian_length_plus_block():
    wire = struct.pack(">I", len(BODY)) + lz4.block.compress(BODY, store_size=False)
    assert compress(Compression.LZ4, BODY) == wire
    assert decompress(Compression.LZ4, wire) == BODY


def test_truncated_lz4():
    wire = compress(Compression.LZ4, BODY)
    with pytest.raises(CompressionError, match="lz4"):
        decompress(Compression.LZ4, wire[:-5])


def test_lz4_shorter_than_prefix():
    with pytest.raises(CompressionError, match="prefix"):
        decompress(Compression.LZ4, b"\x00\x01")


def test_lz4_oversize_claim_is_refused_before_allocating():
    wire = struct.pack(">I", 2**31) + b"\x00"
    with pytest.raises(DecompressedTooLarge, match="claims 2147483648"):
        decompress(Compression.LZ4, wire)


def test_snappy_oversize_claim():
    bomb = snappy.compress(b"\0" * (2 * 1024 * 1024))
    with pytest.raises(DecompressedTooLarge):
        decompress(Compression.SNAPPY, bomb, max_size=1024 * 1024)


def test_zlib_bomb_is_bounded():
    bomb = zlib.compress(b"\0" * (8 * 1024 * 1024))
    assert len(bomb) < 20_000
    with pytest.raises(DecompressedTooLarge):
        decompress(Compression.ZLIB, bomb, max_size=1024 * 1024)


def test_truncated_zlib():
    with pytest.raises(CompressionError, match="truncated"):
        decompress(Compression.ZLIB, zlib.compress(BODY)[:-6])


def test_garbage_zlib():
    with pytest.raises(CompressionError):
        decompress(Compression.ZLIB, b"not zlib at all")


def test_garbage_snappy():
    with pytest.raises(CompressionError):
        decompress(Compression.SNAPPY, b"\xff\xff\xff\xff\xff\xff")


def test_exactly_at_the_limit_is_fine():
    for m in METHODS:
        assert decompress(m, compress(m, BODY), max_size=len(BODY)) == BODY


@pytest.mark.parametrize("method", [1, 2, 3])
@settings(max_examples=300)
@given(data=st.binary(max_size=256))
def test_arbitrary_bytes_give_value_or_compression_error(method, data):
    try:
        out = decompress(method, data, max_size=4096)
    except ProtocolError as e:
        assert isinstance(e, CompressionError)
        return
    assert isinstance(out, bytes) and len(out) <= 4096


@given(st.binary(max_size=2048), st.sampled_from(METHODS))
def test_round_trip_property(body, method):
    assert decompress(method, compress(method, body)) == body
