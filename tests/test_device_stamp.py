"""The device's byte-level rules (devices.stamp) agree with the wire library's Meta and validation."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from devices import stamp
from logjam.errors import MetaError
from logjam.meta import Meta, now_ms
from logjam.validation import is_valid_app_env
from tests.test_device_helpers import meta

pytestmark = pytest.mark.timeout(60)


def now_bytes() -> bytes:
    """The current time as TupleBatch.number passes it to the meta."""
    return now_ms().to_bytes(8, "big")


def library_accepts(frame: bytes) -> bool:
    try:
        Meta.unpack(frame)
        return True
    except MetaError:
        return False


@given(st.binary(min_size=0, max_size=30))
def test_meta_ok_matches_meta_unpack_on_arbitrary_bytes(frame):
    assert stamp.meta_ok(frame) == library_accepts(frame)


@given(st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 255), st.binary(min_size=20, max_size=20))
def test_meta_ok_matches_meta_unpack_on_every_header(tag, comp, version, rest):
    frame = tag.to_bytes(2, "big") + bytes([comp, version]) + rest
    assert stamp.meta_ok(frame) == library_accepts(frame)


def test_stamp_rewrites_device_and_seq_and_keeps_created():
    out = Meta.unpack(stamp.stamp(meta(created_ms=123, seq=9, compression=3, device=0), stamp.device_bytes(7), 42, now_bytes()))
    assert (out.compression, out.device, out.created_ms, out.seq) == (3, 7, 123, 42)


def test_stamp_fills_zero_created_and_normalises_the_swapped_tag():
    now = now_bytes()
    raw = stamp.stamp(meta(created_ms=0, tag=0xBDCA), stamp.device_bytes(1), 2**64 - 1, now)
    assert raw[:2] == b"\xca\xbd"
    out = Meta.unpack(raw)
    assert out.created_ms == int.from_bytes(now, "big") and out.seq == 2**64 - 1


def test_device_bytes_bounds():
    assert stamp.device_bytes(2**32 - 1) == b"\xff\xff\xff\xff"
    with pytest.raises(ValueError):
        stamp.device_bytes(2**32)
    with pytest.raises(ValueError):
        stamp.device_bytes(-1)


@given(st.binary(max_size=40))
def test_label_is_the_name_only_when_the_library_accepts_it(name):
    assert stamp.label(name) == (name.decode("ascii") if is_valid_app_env(name) else stamp.INVALID_LABEL)
