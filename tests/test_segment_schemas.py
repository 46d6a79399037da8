"""The segment codec is declarative: every command's schema round-trips any value its
fields can hold, and a schema that does not match its class is refused at import."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.segment import commands, fields
from bridges.segment import engine as wire

pytestmark = pytest.mark.timeout(120)

_BY_FIELD: dict[Any, st.SearchStrategy] = {
    fields.Int8: st.integers(-(2**7), 2**7 - 1),
    fields.Int32: st.integers(-(2**31), 2**31 - 1),
    fields.Int64: st.integers(-(2**63), 2**63 - 1),
    fields.Boolean: st.booleans(),
    fields.Uuid: st.uuids(),
    fields.Utf: st.text(max_size=12),
    fields.Bytes: st.binary(max_size=40),
    fields.Rest: st.binary(max_size=40),
    fields.Event: st.binary(max_size=40),
    fields.PaddingLength: st.integers(0, 40),
}


def _strategy(field: Any) -> st.SearchStrategy:
    return _strategy(field.field) if isinstance(field, fields.Trailing) else _BY_FIELD[field]


ALL = sorted({**commands.SERVER_PARSES, **commands.CLIENT_PARSES}.values(), key=lambda c: c.CODE)


def test_every_command_has_a_schema_the_generic_codec_walks() -> None:
    assert len(ALL) == 26
    for cls in ALL:
        assert not hasattr(cls, "parse") and not hasattr(cls, "fields"), cls  # no hand-written pairs
        assert [name for name, _ in cls.SCHEMA] == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_schema_round_trips(cls: type, data: st.DataObject) -> None:
    values = [data.draw(_strategy(f), label=name) for name, f in cls.SCHEMA]
    command = cls(*values)
    raw = wire.encode(command)
    code, n = wire.HEADER.unpack_from(raw)
    assert (code, n) == (cls.CODE, len(raw) - wire.HEADER_SIZE)
    assert wire.decode(cls, raw[wire.HEADER_SIZE :]) == command


def test_trailing_fields_take_their_defaults_when_absent() -> None:
    full = wire.encode(wire.NoSuchSegment(7, "s", "trace", 99))[wire.HEADER_SIZE :]
    without_offset = full[:-8]
    without_both = without_offset[:-2 - len("trace")]
    assert wire.decode(wire.NoSuchSegment, without_offset) == wire.NoSuchSegment(7, "s", "trace", -1)
    assert wire.decode(wire.NoSuchSegment, without_both) == wire.NoSuchSegment(7, "s", "", -1)
    with pytest.raises(wire.SegmentProtocolError) as e:
        wire.decode(wire.NoSuchSegment, without_both[:-1])  # a required field cut short
    assert e.value.reason == "truncated_command"


def test_a_schema_that_does_not_match_its_class_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Swapped:
        request_id: int
        segment: str
        CODE: ClassVar[int] = 21
        SCHEMA: ClassVar[commands.Schema] = (("segment", fields.Utf), ("request_id", fields.Int64))

    with pytest.raises(TypeError, match="does not list its fields"):
        commands._register(Swapped)
