"""The mapper's batch splice (`EventMapper._splice`) against orjson and the per-event mapping.

A run of events is mapped by writing each plain object's text with its @metadata spliced
in, joined into one packed batch; orjson decides what is a plain, non-empty object
without "@metadata", and everything else goes through `add` on its own. (This replaced a
hand-written C validator that had to agree with orjson byte for byte.) The differential
properties feed arbitrary bytes and mutated JSON-ish text and require `add_payloads` to give
byte for byte what the per-event mapping (`add`, one event at a time) gives.
"""

import datetime
import itertools
import random
from array import array

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from bridges.host.mapping import Batches, EventMapper, Positions, body_and_raw
from logjam.message import body_from_bytes

pytestmark = pytest.mark.timeout(300)

CREATED = 4242


def add_texts(mapper: EventMapper, out: Batches, data: bytes, offsets, lengths, common: dict,
              positions: Positions = Positions(), **kw) -> None:
    """Payloads as slices of one buffer, the way the Lumberjack bridge hands a run of J frames over."""
    view = memoryview(data)
    mapper.add_payloads(out, [view[o:o + n] for o, n in zip(offsets, lengths)], common, positions, **kw)


def scan(text: bytes) -> tuple[int, int | None]:
    """(1, its created_ms) when the splice takes `text` as a plain event (a packed batch), else (0, None)."""
    m = EventMapper(app_env="a-b", topic="t", instance="i")
    out = m.batches()
    add_texts(m, out, text, [0], [len(text)], {"p": 1}, created_ms=CREATED)
    batch = out.batches[0]
    return (1, batch.created_ms[0]) if batch.packed is not None else (0, None)


def plain_object(text: bytes) -> bool:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return value.__class__ is dict and bool(value) and "@metadata" not in value


# -- unit vectors: spliced (1) or mapped on their own (0) --------------------------------

ACCEPTED = [
    b'{"a":1}',
    b' \t\r\n{ "a" : 1 , "b" : [ ] , "c" : { } } \r\n\t ',
    b'{"s":"plain \\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\u00E9 \\u0000 \\uFFFF done"}',
    b'{"u":"h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbe \xf4\x8f\xbf\xbf \x7f"}',
    b'{"n":[0,-0,1.5,-1.5e10,2E+99,3e-99,1.000000000000000000000000000001,9999999999999999999,-9999999999999999999]}',
    b'{"n":9999999999999999999e99}',
    b'{"l":[true,false,null,{"x":[[]]}]}',
    b'{"@timestamp":"2024-01-02T03:04:05.678Z","inner":{"@metadata":1}}',
    b'{"a":1,"a":2}',
    b'{"deep":' + b"[" * 127 + b"]" * 127 + b"}",
    # Once declined by the C validator (a surrogate pair, long numbers, escaped keys): orjson reads them.
    b'{"a":"\\ud83d\\ude00"}',                       # a surrogate pair
    b'{"a":18446744073709551615}',                  # 20 integer digits
    b'{"a":1' + b"0" * 300 + b"}",
    b'{"a":1e-400}', b'{"a":1E+099}',               # 3 exponent digits
    b'{"\\n":1}', b'{"\\u0040timestamp":"x"}',     # escaped top-level keys
    b'{"deep":' + b"[" * 128 + b"]" * 128 + b"}",   # deeper than 128
]

# Text orjson refuses, or reads as something other than a plain non-empty object.
REFUSED = [
    b"", b" ", b"{", b"}", b"[1]", b'"x"', b"1", b"null", b"{}", b" { } ",
    b'\xef\xbb\xbf{"a":1}',                         # a BOM
    b'{"a":1}x', b'{"a":1}\x0b', b'{"a":1}\x00', b'{"a":1}{}', b'\x0c{"a":1}',
    b'{"a":1,}', b'{"a" 1}', b'{a:1}', b"{'a':1}", b'{"a":1 "b":2}', b'{,"a":1}',
    b'{"a":[1,]}', b'{"a":[1 2]}', b'{"a":{"b"}}', b'{"a":{"b":}}',
    b'{"a":"\x00"}', b'{"a":"\x1f"}', b'{"a":"tab\there"}', b'{"a":"nl\nhere"}',
    b'{"a":"\\x"}', b'{"a":"\\U0041"}', b'{"a":"\\u12"}', b'{"a":"\\u12g4"}', b'{"a":"\\', b'{"a":"\\"}',
    b'{"a":"\\ud800"}', b'{"a":"\\udfff"}', b'{"a":"\\ud83dx"}',
    b'{"a":"\x80"}', b'{"a":"\xc0\xaf"}', b'{"a":"\xc1\xbf"}', b'{"a":"\xe0\x80\xaf"}',
    b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf0\x80\x80\xaf"}', b'{"a":"\xf4\x90\x80\x80"}',
    b'{"a":"\xf5\x80\x80\x80"}', b'{"a":"\xff"}', b'{"a":"\xc3"}', b'{"a":"\xe2\x82"}',
    b'{"a":01}', b'{"a":-}', b'{"a":+1}', b'{"a":.5}', b'{"a":1.}', b'{"a":1e}', b'{"a":1e+}',
    b'{"a":0x1}', b'{"a":NaN}', b'{"a":Infinity}', b'{"a":-Infinity}', b'{"a":1e400}', b'{"a":1.8e308}',
    b'{"a":tru}', b'{"a":True}', b'{"a":nul}', b'{"a":falsey}',
    b'{"@metadata":{"_id":"x"}}', b'{"a":1,"@metadata":null}',
    b'{"\\u0040metadata":1}', b'{"a":1,"@\\u006detadata":{}}',  # @metadata, spelt with an escape
    b'{"deep":' + b"[" * 1100 + b"]" * 1100 + b"}",
]

@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_vectors(text):
    assert plain_object(text)
    assert scan(text)[0] == 1
    core = text.rstrip(b" \t\r\n")
    for end in range(len(core)):  # every truncation is refused by orjson, so declined
        assert scan(core[:end])[0] == 0, core[:end]
    assert scan(text + b" \n")[0] == 1
    assert scan(text + b"x")[0] == 0 and scan(text + b"{}")[0] == 0


@pytest.mark.parametrize("text", REFUSED)
def test_refused_vectors(text):
    assert not plain_object(text)
    assert scan(text)[0] == 0


@pytest.mark.parametrize(
    "text, stamp",
    [
        (b'{"a":1}', CREATED),
        (b'{"@timestamp":"2024-01-02T03:04:05.678Z"}', 1704164645678),
        (b'{"x":{"@timestamp":"2024-01-02T03:04:05.678Z"}}', CREATED),          # nested: not the event's
        (b'{"@timestamp":"2024-01-02T03:04:05.678Z","@timestamp":"2024-01-02T03:04:06Z"}', 1704164646000),  # the last
        (b'{"@timestamp":1704164645678}', 1704164645678),
        (b'{"@timestamp":"2024-01-02T03:04:05.678\\u005a"}', 1704164645678),
        (b'{"@timestamp":"yesterday"}', CREATED),
        (b'{"@timestamp" : "2024-01-02T03:04:05+01:00" }', 1704164645000 - 3600_000),
    ],
)
def test_timestamp(text, stamp):
    assert scan(text) == (1, stamp)


# -- differential: add_payloads against the per-event Python mapping ------------------------

def reference(mapper: EventMapper, payloads: list[bytes], common: dict, positions: Positions, created: int) -> Batches:
    """The per-event Python mapping, as add_payloads did it before the C validator."""
    out = mapper.batches()
    for i, payload in enumerate(payloads):
        body, raw = body_and_raw(payload)
        mapper.add(out, body, positions.metadata(common, i), created_ms=created, raw=raw)
    return out


def messages(out: Batches) -> list[tuple[str, bytes, int, int]]:
    return [(m.app_env, bytes(m.body), m.meta.created_ms, m.meta.compression) for m in out.messages()]


def pack(payloads: list[bytes], gaps: list[bytes]) -> tuple[bytes, array, array]:
    """The payloads in one buffer, in a shuffled order with bytes between them, as a protocol frame might hold them."""
    order = list(range(len(payloads)))
    random.Random(len(gaps)).shuffle(order)
    data, offsets = bytearray(), [0] * len(payloads)
    for k, i in enumerate(order):
        data += gaps[k % len(gaps)] if gaps else b""
        offsets[i] = len(data)
        data += payloads[i]
    return bytes(data), array("I", offsets), array("I", map(len, payloads))


def check_same(payloads: list[bytes], common: dict, positions: Positions, gaps: list[bytes]) -> int:
    """add_payloads is the per-event mapping for these payloads; only plain objects are spliced. Returns how many are."""
    data, offsets, lengths = pack(payloads, gaps)
    native, python = EventMapper(app_env="a-b", topic="t", instance="i"), EventMapper(app_env="a-b", topic="t", instance="i")
    out = native.batches()
    add_texts(native, out, data, offsets, lengths, common, positions, created_ms=CREATED)
    assert messages(out) == messages(reference(python, payloads, common, positions, CREATED))
    assert native._next_n == python._next_n
    accepted = 0
    for text in payloads:
        spliced = scan(text)[0]
        assert spliced == plain_object(text), text
        accepted += spliced
    return accepted


# Clean parts make text orjson accepts (mostly); `_mutated` and the dirty parts break it in the ways a splice must not miss.
_clean_piece = st.one_of(
    st.text(st.characters(exclude_characters='"\\', exclude_categories=("Cc", "Cs")), max_size=6).map(str.encode),
    st.sampled_from([b'\\"', b"\\\\", b"\\/", b"\\b", b"\\f", b"\\n", b"\\r", b"\\t", b"\\u00e9", b"\\u0000", b"\\uFFFF"]),
)
_dirty_piece = st.one_of(
    st.text(st.characters(exclude_characters='"\\'), max_size=6).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\\ud83d\\ude00", b"\\ud800", b"\\uDFFF", b"\\x", b"\\U0041", b"\\u12", b"\\", b"\x00", b"\t"]),
    st.integers(0, 0xFFFF).map(lambda c: b"\\u%04X" % c),
    st.binary(min_size=1, max_size=3),
)


def _string(piece: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(piece, max_size=4).map(lambda parts: b'"' + b"".join(parts) + b'"')


_clean_number = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from([b"", b"-"]),
    st.one_of(st.just(b"0"), st.integers(1, 10**19 - 1).map(lambda n: str(n).encode())),
    st.one_of(st.just(b""), st.text("0123456789", min_size=1, max_size=20).map(lambda s: b"." + s.encode())),
    st.one_of(st.just(b""), st.builds(bytes.__add__, st.sampled_from([b"e", b"E+", b"e-", b"E"]),
                                      st.text("0123456789", min_size=1, max_size=2).map(str.encode))),
)
_dirty_number = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from([b"", b"-", b"+"]),
    st.one_of(st.integers(1, 10**25).map(lambda n: str(n).encode()), st.sampled_from([b"01", b"", b"0x1"])),
    st.one_of(st.just(b""), st.text("0123456789", max_size=25).map(lambda s: b"." + s.encode())),
    st.one_of(st.just(b""), st.builds(bytes.__add__, st.sampled_from([b"e", b"E+", b"e-"]),
                                      st.text("0123456789", max_size=4).map(str.encode))),
)
_timestamp = st.one_of(
    st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31),
                 timezones=st.none() | st.just(datetime.timezone.utc))
    .map(lambda d: orjson.dumps(d.isoformat(timespec=["auto", "seconds", "milliseconds"][d.microsecond % 3]))),
    st.sampled_from([b'"2024-05-01T12:00:00.123Z"', b'"2024-05-01T12:00:00Z"', b'"2024-02-30T00:00:00Z"',
                     b'"2024-05-01 12:00:00"', b'"2024-05-01T12:00:00+0100"', b'"x"', b'""', b"1700000000",
                     b"1700000000123", b"-5", b"null", b'"2024-05-01T12:00:00\\u005a"']),
)
_clean_ws = st.sampled_from([b"", b"", b"", b" ", b"\n", b"\t", b"\r\n  "])
_dirty_ws = st.sampled_from([b"", b" ", b"\x0b", b"\x0c", b"\xc2\xa0", b"\x00"])
_clean_key = st.one_of(_string(_clean_piece), st.sampled_from([b'"@timestamp"', b'"message"', b'"a"', b'"a"']))
# At the top level C declines escaped keys: clean events' top-level keys have none.
_plain_key = st.one_of(
    st.text(st.characters(exclude_characters='"\\', exclude_categories=("Cc", "Cs")), max_size=8).map(lambda k: b'"%b"' % k.encode()),
    st.sampled_from([b'"@timestamp"', b'"message"', b'"a"', b'"a"']))
_dirty_key = st.one_of(_string(_dirty_piece),
                       st.sampled_from([b'"@metadata"', b'"\\u0040metadata"', b'"\\u0040timestamp"', b'"\\n"']))


def _array(ws: st.SearchStrategy[bytes], inner: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(ws, inner, ws), max_size=4).map(lambda items: b"[" + b",".join(a + v + b for a, v, b in items) + b"]")


def _object(ws: st.SearchStrategy[bytes], key: st.SearchStrategy[bytes], inner: st.SearchStrategy[bytes],
            min_size: int = 0) -> st.SearchStrategy[bytes]:
    return st.lists(st.tuples(ws, key, ws, ws, inner, ws), min_size=min_size, max_size=5).map(
        lambda items: b"{" + b",".join(a + k + b + b":" + c + v + d for a, k, b, c, v, d in items) + b"}")


def _json(ws, top_key, key, scalar) -> st.SearchStrategy[bytes]:  # type: ignore[no-untyped-def]
    value = st.recursive(scalar, lambda inner: _array(ws, inner) | _object(ws, key, inner), max_leaves=10)
    return st.builds(lambda a, obj, b: a + obj + b, ws, _object(ws, top_key, value | _timestamp, min_size=1), ws)


_literal = st.sampled_from([b"true", b"false", b"null"])
_clean_event = _json(_clean_ws, _plain_key, _clean_key, st.one_of(_clean_number, _string(_clean_piece), _timestamp, _literal))
_dirty_event = _json(_clean_ws | _dirty_ws, _clean_key | _dirty_key, _clean_key | _dirty_key, st.one_of(
    _clean_number, _dirty_number, _string(_clean_piece), _string(_dirty_piece), _timestamp, _literal,
    st.sampled_from([b"nul", b"True", b"NaN", b"-Infinity", b"1e400"])))


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    text = draw(_clean_event)
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["truncate", "insert", "delete", "replace", "bom", "trail"]))
        if kind == "truncate":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from([b"\x00", b"\x1f", b"\\", b'"', b",", b"}", b"]", b"\xff",
                                                     b"\xed\xa0\x80", b" ", b"\\ud800", b"9" * 20])) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + 1:]
        elif kind == "replace" and at < len(text):
            text = text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1:]
        elif kind == "bom":
            text = b"\xef\xbb\xbf" + text
        else:
            text = text + draw(st.sampled_from([b" ", b"\n", b"x", b"{}", b"\x00", b"\r\n"]))
    return text


_payload = st.one_of(_clean_event, _clean_event, _mutated(), _dirty_event, st.binary(max_size=40),
                     st.text(max_size=20).map(str.encode))
_common = st.dictionaries(st.sampled_from(["protocol", "peer", "nonce"]), st.text(max_size=4) | st.integers(0, 9), max_size=3)
_gaps = st.lists(st.binary(max_size=5), max_size=3)


def _positions(n: int, kind: int) -> Positions:
    if kind == 0:
        return Positions()
    if kind == 1:
        return Positions("seq", array("I", range(7, 7 + n)))
    return Positions("event_number", range(n), "segment_offset", [v * 10 for v in range(n)], "seg:x@", range(100, 100 + n))


@settings(max_examples=500, deadline=None)
@given(payloads=st.lists(_payload, min_size=1, max_size=8), common=_common, kind=st.integers(0, 2), gaps=_gaps)
def test_add_texts_is_the_python_mapping_for_json_ish_text(payloads, common, kind, gaps):
    accepted = check_same(payloads, common, _positions(len(payloads), kind), gaps)
    event(f"spliced {round(4 * accepted / len(payloads)) * 25}% of the events")


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(st.binary(max_size=60), min_size=1, max_size=6), common=_common, kind=st.integers(0, 2), gaps=_gaps)
def test_add_texts_is_the_python_mapping_for_arbitrary_bytes(payloads, common, kind, gaps):
    check_same(payloads, common, _positions(len(payloads), kind), gaps)


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(_payload, min_size=1, max_size=8), kind=st.integers(0, 2))
def test_python_fallback_and_add_payloads_give_the_same(payloads, kind):
    """Where the splice does not apply (`_splice_applies` false) add_payloads maps event by event: the same events."""
    data, offsets, lengths = pack(payloads, [b"--"])
    outs = []
    for how in ("splice", "each", "payloads"):
        m = EventMapper(app_env="a-b", topic="t", instance="i")
        if how == "each":
            m._splice_applies = lambda *_: False  # type: ignore[method-assign]
        out = m.batches()
        positions = _positions(len(payloads), kind)
        if how == "payloads":
            m.add_payloads(out, payloads, {"protocol": "x"}, positions, created_ms=CREATED)
        else:
            add_texts(m, out, data, offsets, lengths, {"protocol": "x"}, positions, created_ms=CREATED)
        outs.append((messages(out), m._next_n))
    assert outs[0] == outs[1] == outs[2]


def parsed_both_ways(raws: list, bodies: list, positions: Positions) -> list:
    """`add_payloads` of payloads the engine parsed, with the splice and event by event: the same messages."""
    got = []
    for splice in (True, False):
        m = EventMapper(app_env="a-b", topic="t", instance="i")
        if not splice:
            m._splice_applies = lambda *_: False  # type: ignore[method-assign]
        out = m.batches()
        m.add_payloads(out, raws, {"protocol": "p"}, positions, bodies=[dict(b) for b in bodies], created_ms=9)
        got.append(messages(out))
    assert got[0] == got[1]
    return got[0]


def test_parsed_payloads_are_add_per_event_with_and_without_the_splice():
    """Payloads the engine already parsed are valid objects (one with a surrogate pair): the same messages, in order, either way."""
    raws = [b'{"a":1}', b'{"s":"\\ud83d\\ude00","@timestamp":"2024-01-02T03:04:05Z"}', b'{"b":2,"@timestamp":5}']
    got = parsed_both_ways(raws, [orjson.loads(r) for r in raws], Positions("seq", [1, 2, 3]))
    assert [c for _, _, c, _ in got] == [9, 1704164645000, 5000]
    assert [orjson.loads(b)["@metadata"]["_id"] for _, b, _, _ in got] == ["i:1", "i:2", "i:3"]


def test_parsed_payloads_without_their_text_are_mapped_on_their_own():
    """An engine that parsed the events passes None for a text whose body is a wrapper, not that
    text's object (Courier's `_unmarshal_failure` events): each is `add`ed on its own, between
    spliced events, as the per-event mapping gives it. (A non-JSON Courier event once crashed
    the splice at `raw[-1]`.)"""
    texts = [b'{"a":1}', b"not json", b"\xff\xfe", b'{"b":2}', b"[1,2]", b"{}", b" "]
    bodies = [orjson.loads(t) if t.startswith(b'{"') else body_from_bytes(t, ("_unmarshal_failure",)) for t in texts]
    raws = [t if t.startswith(b'{"') else None for t in texts]
    got = parsed_both_ways(raws, bodies, Positions("index", range(len(texts))))
    assert [orjson.loads(b)["@metadata"]["index"] for _, b, _, _ in got] == list(range(len(texts)))
    assert [{k: v for k, v in orjson.loads(b).items() if k != "@metadata"} for _, b, _, _ in got] == bodies


def test_keys_number_on_across_declined_events():
    """Without positions' keys, events are numbered in order; an event with its own key takes none."""
    payloads = [b'{"a":1}', b'{"@metadata":{"_id":"mine"},"b":2}', b"text", b'{"c":3}', b'{"d":"\\ud83d\\ude00"}']
    data, offsets, lengths = pack(payloads, [])
    m = EventMapper(app_env="a-b", topic="t", instance="i")
    out = m.batches()
    add_texts(m, out, data, offsets, lengths, {}, created_ms=1)
    ids = [orjson.loads(b)["@metadata"]["_id"] for _, b, _, _ in messages(out)]
    assert ids == ["i:1", "mine", "i:2", "i:3", "i:4"]
    assert m._next_n == 5


def test_common_naming_a_position_field_maps_in_python():
    """A common key the splice would write twice (here "seq") makes the mapper map event by event: same as it."""
    payloads = [b'{"a":1}', b'{"b":2}']
    data, offsets, lengths = pack(payloads, [])
    for common in ({"seq": "x"}, {"_id": "fixed"}):
        m, ref = EventMapper(app_env="a-b", topic="t", instance="i"), EventMapper(app_env="a-b", topic="t", instance="i")
        out = m.batches()
        positions = Positions("seq", [5, 6])
        add_texts(m, out, data, offsets, lengths, common, positions, created_ms=1)
        assert messages(out) == messages(reference(ref, payloads, common, positions, 1))


def test_many_declined_events_in_a_large_batch():
    """Alternating declined events: one packed batch per stretch, still the per-event mapping, in order."""
    payloads = [b'{"n":%d,"@timestamp":"2024-01-02T03:04:%02dZ"}' % (i, i % 60) if i % 3 else b"line %d" % i
                for i in range(600)]
    check_same(payloads, {"protocol": "x"}, Positions("seq", array("I", range(600))), [b"\x00\x01"])
    assert list(itertools.islice((scan(p)[0] for p in payloads), 3)) == [0, 1, 1]
