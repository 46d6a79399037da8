"""Meta frame vectors and properties."""

import struct

import pytest
from hypothesis import given, strategies as st

from logjam import Meta, MetaError, ProtocolError
from logjam.meta import Compression

# tag CABD, lz4, version 1, device 7, created 1700000000123, seq 42
VECTOR = bytes.fromhex("cabd0301" "00000007" "0000018bcfe5687b" "000000000000002a")


def test_vector_unpacks():
    assert Meta.unpack(VECTOR) == Meta(compression=3, device=7, created_ms=1700000000123, seq=42)


def test_pack_round_trip():
    meta = Meta(Compression.SNAPPY, 2**32 - 1, 2**64 - 1, 2**64 - 1)
    assert Meta.unpack(meta.pack()) == meta
    assert Meta.unpack(VECTOR).pack() == VECTOR


def test_byte_swapped_tag_is_accepted():
    swapped = b"\xbd\xca" + VECTOR[2:]
    assert Meta.unpack(swapped).seq == 42


def test_memoryview_accepted():
    assert Meta.unpack(memoryview(VECTOR)).device == 7


@pytest.mark.parametrize("frame", [VECTOR[:-1], VECTOR + b"\0", b"", VECTOR * 2])
def test_wrong_length(frame):
    with pytest.raises(MetaError, match="24 bytes"):
        Meta.unpack(frame)


def test_wrong_version():
    with pytest.raises(MetaError, match="version is 2"):
        Meta.unpack(VECTOR[:3] + b"\x02" + VECTOR[4:])


def test_wrong_tag():
    with pytest.raises(MetaError, match="tag"):
        Meta.unpack(b"\x00\x00" + VECTOR[2:])


def test_unknown_compression():
    with pytest.raises(MetaError, match="compression"):
        Meta.unpack(VECTOR[:2] + b"\x09" + VECTOR[3:])


def test_meta_error_is_remote_protocol_error():
    with pytest.raises(ProtocolError) as info:
        Meta.unpack(b"x")
    assert info.value.reason == "broken_meta"


@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_meta_or_meta_error(data):
    try:
        meta = Meta.unpack(data)
    except MetaError:
        return
    assert len(data) == 24 and meta.version == 1


@given(st.integers(0, 3), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_round_trip_property(c, d, t, s):
    m = Meta(c, d, t, s)
    assert Meta.unpack(m.pack()) == m
    assert struct.unpack(">H", m.pack()[:2])[0] == 0xCABD


def test_the_raw_byte_view_is_the_same_layout():
    """The device renumbers metas as bytes (META_RENUMBER, META_HEAD, META_CREATED): the same 24 bytes Meta packs."""
    from logjam.meta import META_COMPRESSION_AT, META_CREATED, META_DEVICE, META_HEAD, META_RENUMBER

    m = Meta(Compression.LZ4, device=7, created_ms=1_700_000_000_123, seq=42)
    raw = m.pack()
    assert META_RENUMBER.pack(raw[META_HEAD], (7).to_bytes(4, "big"), (1_700_000_000_123).to_bytes(8, "big"), 42) == raw
    assert raw[META_COMPRESSION_AT] == Compression.LZ4
    assert int.from_bytes(raw[META_DEVICE], "big") == 7
    assert int.from_bytes(raw[META_CREATED], "big") == 1_700_000_000_123
