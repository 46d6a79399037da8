"""native/variant.c and its Python twin (importer/variant.py, importer/variant_py.py) against
Spark's own parse_json, byte for byte.

The importer encodes `doc` itself, with the C module or, under LOGJAM_NATIVE=off, its Python
twin; either must give the VARIANT Spark's parse_json gives. So each vector's bytes from the
encoder `DocEncoder.load()` gives (the C under LOGJAM_NATIVE=require, the twin under off: each
of these tests runs under both, `native_mode`) are compared with the bytes Spark writes for
`try_parse_json(body)` (unshredded), and Spark must read the encoder's output back as the same JSON. Vectors: one of
each shape the encoding has (integer widths, decimals, doubles, short and long strings, escapes
and surrogate pairs, keys Java orders differently from UTF-8, objects and arrays past 255
entries and offsets past 64 KiB), then random documents. Bodies that are not one JSON object
get no `doc`, from either.

Then the twin against the C, without Spark: the same arrays (validity, `value`, `metadata`) for
every vector, for edge cases of numbers, depth and size, and for generated documents and
arbitrary bytes (Hypothesis). Those compare both paths in one test, so they run once (they skip
under an outer LOGJAM_NATIVE=off, where there is no C to compare with: `harness.native.c_module`);
so do the twin's known answers, which name the twin itself.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from importer.decode import BatchBuilder
from importer.variant import MODULE, DocEncoder
from importer.variant_py import MAX_PART, PyDocEncoder
from logjam import native
from table.schema import DOC_ARROW_TYPE, DOC_EXPR
from tests.conftest import NATIVE_MODES, native_env
from tests.spark_fixture import append_rows
from tests.test_importer_decode_native import RUN_BYTES
from harness.native import c_module

pytestmark = [pytest.mark.timeout(300), pytest.mark.native]

VECTORS: list[str] = [
    "{}", '{"a":1}', ' \n{"a" : [ ] , "b":{ }}\t', '{"n":null,"t":true,"f":false}',
    '{"i":0,"j":-0,"k":127,"l":-128,"m":128,"n":-129,"o":32767,"p":32768,"q":-32769,"r":2147483647,'
    '"s":2147483648,"t":-2147483649,"u":9223372036854775807,"v":-9223372036854775808}',
    '{"big":9223372036854775808,"neg":-9223372036854775809,"d38":12345678901234567890123456789012345678,'
    '"d39":123456789012345678901234567890123456789}',
    '{"a":1.5,"b":-0.0,"c":0.000,"d":1.50,"e":0.05,"f":123456789.1,"g":1234567890.1,"h":0.0000000001,'
    '"i":1.0000000000000000001,"j":3.14159265358979323846264338327950288419,"k":-99999999999999999.99}',
    '{"e":1e3,"f":1E-7,"g":-2.5e+10,"h":1e400,"i":-1e-400,"j":0e0}',
    '{"s":"","t":"' + "x" * 63 + '","u":"' + "y" * 64 + '","v":"' + "z" * 70000 + '"}',
    r'{"esc":"\"\\\/\b\f\n\r\t\u0000\u001f\u00e9\u4e2d\ud83d\ude00","raw":"é中😀"}',
    '{"\ue000":1,"\U0001f600":2,"a":3,"\u00e9":4,"\uffff":5,"\U00010000":6}',
    '{"b":1,"a":2,"c":{"b":3,"a":[{"c":4,"a":5}]}}',
    json.dumps({f"k{i:04d}": i for i in range(300)}),
    json.dumps({"a": list(range(300)), "b": ["s" * 300] * 300}),
    json.dumps({"deep": [[[[[[{"x": [1, {"y": "z"}]}]]]]]]}),
    '{"a":1} trailing text, which parse_json does not read',
]
NOT_OBJECTS = ["[1,2]", '"s"', "1", "null", "", "  ", '{"a":1,"a":2}', '{"a":}', '{"a":01}',
               '{"a":"\\ud800"}', '{"a":1.}', '{"a":-}', '{"a":[1,]}', '{"a" 1}', '{a:1}', "{" * 200 + "}" * 200]


def random_value(rnd: random.Random, depth: int) -> Any:
    kind = rnd.randrange(9 if depth < 5 else 6)
    if kind == 0:
        return rnd.choice([None, True, False])
    if kind == 1:
        return rnd.choice([rnd.randrange(-300, 300), rnd.randrange(-2**40, 2**40), rnd.randrange(-2**70, 2**70)])
    if kind == 2:
        return rnd.choice([rnd.random() * 10 ** rnd.randrange(-5, 20), rnd.uniform(-1e300, 1e300)])
    if kind in (3, 4, 5):
        alphabet = "ab\"\\\n\t é中😀\x01"
        return "".join(rnd.choice(alphabet) for _ in range(rnd.choice([0, 3, 63, 64, 100])))
    if kind in (6, 7):
        return {"".join(rnd.choice("abcé😀") for _ in range(rnd.randrange(1, 5))): random_value(rnd, depth + 1)
                for _ in range(rnd.randrange(0, 8))}
    return [random_value(rnd, depth + 1) for _ in range(rnd.randrange(0, 6))]


def random_documents(n: int) -> list[str]:
    rnd = random.Random(28)
    docs = []
    for _ in range(n):
        doc = {f"f{i}": random_value(rnd, 1) for i in range(rnd.randrange(0, 12))}
        text = json.dumps(doc, ensure_ascii=rnd.random() < 0.5)
        # Decimal texts JSON writers do not make from floats.
        decimal = rnd.choice(["-1.10", "0.000", "12.5000", "-0.0", "7"])
        docs.append(f'{text[:-1]}{", " if doc else ""}"dec": {decimal}}}')
    return docs


def staged(bodies: list[bytes]) -> pa.Table:
    builder = BatchBuilder()
    for i, body in enumerate(bodies):
        builder.add_raw("test-prod", "logs", body, 0, 1, 1_767_614_400_000, i + 1, 1_767_614_500_000_000)
    return builder.build()


def encoder() -> DocEncoder | PyDocEncoder:
    """The encoder the importer would use: the C one, or the Python twin under LOGJAM_NATIVE=off."""
    got = DocEncoder.load()
    want = {"off": PyDocEncoder, "require": DocEncoder}.get(native.mode(), (DocEncoder, PyDocEncoder))
    assert isinstance(got, want), (native.mode(), got)
    return got


def encoded(table: pa.Table) -> list[tuple[bytes, bytes] | None]:
    return [None if d is None else (d["value"], d["metadata"]) for d in encoder().column(table).to_pylist()]


def sparks(spark: Any, tmp: Path, table: pa.Table) -> list[tuple[bytes, bytes] | None]:
    """What Spark writes, unshredded, for `DOC_EXPR` over the same bodies, as the Parquet bytes."""
    source, out = tmp / f"in-{uuid.uuid4().hex}.parquet", tmp / f"out-{uuid.uuid4().hex}"
    pq.write_table(table.select(["seq", "body"]), source)
    spark.conf.set("spark.sql.variant.writeShredding.enabled", "false")
    spark.read.parquet(f"file://{source}").selectExpr("seq", f"{DOC_EXPR} AS doc").coalesce(1) \
        .write.parquet(f"file://{out}")
    rows = pq.read_table(out).sort_by("seq").column("doc").to_pylist()
    return [None if d is None else (d["value"], d["metadata"]) for d in rows]


def committed(spark: Any, tmp: Path, table: pa.Table) -> Any:
    """The rows committed to a Delta table of their own as an importer commits them (`doc` by the importer's
    encoder, tests/spark_fixture.py `append_rows`), read back by Spark as the table."""
    encoder()  # the encoder append_rows uses, checked against the switch
    location = tmp / f"table-{uuid.uuid4().hex}"
    append_rows(location, table)
    return spark.read.format("delta").load(f"file://{location}")


def read_back(spark: Any, tmp: Path, table: pa.Table) -> list[tuple[str | None, str | None]]:
    """(`to_json` of the encoder's `doc` read back from the Delta table, `to_json(try_parse_json(body))`) per row."""
    rows = committed(spark, tmp, table).selectExpr("seq", "to_json(doc)", "to_json(try_parse_json(body))") \
        .orderBy("seq").collect()
    return [(r[1], r[2]) for r in rows]


@pytest.fixture()
def spark(spark_server: Any) -> Any:
    session = spark_server.session()  # shared by the test session: settings changed here are undone
    yield session
    session.conf.unset("spark.sql.variant.writeShredding.enabled")


def test_every_vector_encodes_to_the_bytes_spark_writes(spark: Any, tmp_path: Path, native_mode: str) -> None:
    bodies = [v.encode() for v in VECTORS + NOT_OBJECTS + random_documents(400)]
    table = staged(bodies)
    ours, theirs = encoded(table), sparks(spark, tmp_path, table)
    for body, a, b in zip(bodies, ours, theirs):
        assert a == b, body[:200]
    assert all(d is not None for d in ours[:len(VECTORS)])
    assert all(d is None for d in ours[len(VECTORS):len(VECTORS) + len(NOT_OBJECTS)])


def test_spark_reads_the_encoded_doc_back_as_the_same_json(spark: Any, tmp_path: Path, native_mode: str) -> None:
    bodies = [v.encode() for v in VECTORS + random_documents(100)]
    table = staged(bodies)
    back = read_back(spark, tmp_path, table)
    for body, (ours, theirs) in zip(bodies, back):
        assert ours == theirs, body[:200]
    assert all(ours is not None for ours, _ in back[:len(VECTORS)])
    assert sum(ours is not None for ours, _ in back) >= 0.9 * len(back)


def test_lookups_in_large_objects_find_every_field(spark: Any, tmp_path: Path, native_mode: str) -> None:
    """Spark binary-searches an object of 32 fields or more by name in Java's order."""
    keys = [f"k{i}" for i in range(40)] + ["\ue000", "\U0001f600", "é", "\uffff"]
    table = staged([json.dumps({k: i for i, k in enumerate(keys)}).encode()])
    df = committed(spark, tmp_path, table)
    exprs = [f"variant_get(doc, '$[\"{k}\"]', 'int')" for k in keys]
    assert list(df.selectExpr(*exprs).collect()[0]) == list(range(len(keys)))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


@pytest.mark.parametrize("mode", NATIVE_MODES)
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(alphabet='{}[]":,\\ 0123456789.eE+-tfnul"abu\u00e9', max_size=80)
       .map(str.encode) | st.dictionaries(st.text(max_size=4), st.recursive(
           st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
           max_leaves=10)).map(orjson.dumps))
def test_arbitrary_bytes_yield_a_document_or_none(mode: str, body: bytes) -> None:
    """A document only for a body that starts with a JSON object, and always for a valid one."""
    table = pa.table({"body": pa.array([body], pa.binary()).cast(pa.string(), safe=False),
                      "parse_error": pa.nulls(1, pa.string())})
    with native_env(mode):  # not `native_mode`: Hypothesis takes no function-scoped fixture
        result = encoded(table)[0]
    try:
        valid_object = type(json.loads(body, object_pairs_hook=_unique_keys)) is dict
    except (ValueError, UnicodeDecodeError, RecursionError):
        valid_object = False
    if result is not None:
        assert body.lstrip(b" \t\r\n").startswith(b"{")
        assert result[1][0] & 0x0F == 1 and result[0][0] & 0x03 == 2  # metadata version 1; an object
    if valid_object and b"\\ud8" not in body.lower() and b"\\udc" not in body.lower():
        assert result is not None, body


# --- The Python twin against the C, without Spark -----------------------------------------------

def c_encoder() -> DocEncoder:
    """The C encoder to compare the twin with: skips under LOGJAM_NATIVE=off and, under auto, without a
    build; under require a missing build fails (harness.native.c_module)."""
    if native.mode() == "off":
        pytest.skip("LOGJAM_NATIVE=off: no C encoder to compare the Python twin with")
    return DocEncoder(c_module(MODULE))


def table_of(bodies: list[bytes | None]) -> pa.Table:
    """Bodies as the importer's `body` column holds them: any bytes (not checked as UTF-8), NULL allowed."""
    return pa.table({"body": pa.array(bodies, pa.binary()).cast(pa.string(), safe=False),
                     "parse_error": pa.nulls(len(bodies), pa.string())})


def layout(doc: pa.StructArray) -> tuple[list[bool], list[bytes], list[bytes]]:
    """Validity and every row's `value` and `metadata` bytes, NULL rows included (they hold none)."""
    assert doc.type == DOC_ARROW_TYPE and doc.field(0).null_count == doc.field(1).null_count == 0
    return doc.is_valid().to_pylist(), doc.field(0).to_pylist(), doc.field(1).to_pylist()


def assert_twin_matches_c(c: DocEncoder, table: pa.Table) -> None:
    py_doc, c_doc = PyDocEncoder().column(table), c.column(table)
    assert py_doc.null_count == c_doc.null_count
    ours, theirs = layout(py_doc), layout(c_doc)
    bodies = table.column("body").cast(pa.binary()).to_pylist()
    for i, body in enumerate(bodies):
        assert (ours[0][i], ours[1][i], ours[2][i]) == (theirs[0][i], theirs[1][i], theirs[2][i]), \
            (body or b"")[:300]
    assert ours == theirs


def deep(levels: int, inner: str = "1") -> str:
    """An object `levels` containers deep in all (the top object counted), arrays and objects mixed."""
    text = inner
    for i in range(levels - 1):
        text = f"[{text}]" if i % 2 else f'{{"d":{text}}}'
    return f'{{"d":{text}}}'


DIGITS_38 = "12345678901234567890123456789012345678"
EDGES: list[bytes] = [s.encode() if isinstance(s, str) else s for s in [
    # Integers at every width's edges, then past int64 (decimal(38), then a double).
    '{"a":[0,-0,127,128,-128,-129,32767,32768,-32768,-32769,2147483647,2147483648,-2147483648,-2147483649]}',
    '{"a":[9223372036854775807,9223372036854775808,-9223372036854775808,-9223372036854775809,'
    '18446744073709551615,18446744073709551616,99999999999999999999]}',
    '{"a":[' + DIGITS_38 + ",-" + DIGITS_38 + "," + DIGITS_38 + "9," + "9" * 38 + "," + "1" + "0" * 38 + "]}",
    '{"a":' + "7" * 5000 + "}",  # past Python's 4300-digit int() limit: a double, as strtod reads it
    # Decimals: precision and scale at 9/10, 18/19, 38/39; leading zeros are not significant.
    '{"a":[0.0,-0.0,0.000,1.50,-1.5,0.05,123456789.0,1234567890.0,0.123456789,0.1234567890]}',
    '{"a":[123456789012345678.0,1234567890123456789.0,0.000000000000000001,0.0000000000000000001]}',
    '{"a":[0.' + DIGITS_38 + ",0." + DIGITS_38 + "9,0." + "0" * 37 + "1,0." + "0" * 38 + "1,-0." + "0" * 40 + "]}",
    '{"a":[' + DIGITS_38 + ".0," + DIGITS_38[:-1] + ".0,-" + "9" * 20 + "." + "9" * 18 + "]}",
    '{"a":0.' + "3" * 5000 + "}",
    # Doubles: exponents, overflow to infinity, underflow to zero, subnormals, rounding edges.
    '{"a":[1e400,-1e400,1e-400,-1e-400,-0e0,0E+0,1E2,1e-2,2.5e+10,4.9e-324,2.4703282292062328e-324,'
    '2.4703282292062327e-324,1.7976931348623157e308,1.7976931348623158e308,1.7976931348623159e308,'
    '9007199254740993e0,1e99999999999999999999,1e-99999999999999999999,0.1e1,123.456e-2]}',
    # Strings: short/long edge, escapes, surrogates, UTF-8 in keys ordered the Java way.
    '{"s":["' + "é" * 31 + '","' + "é" * 31 + 'x","' + "x" * 63 + '","' + "x" * 64 + '"]}',
    r'{"a":"\u00E9\u00e9\/\ud83d\ude00\uDBFF\uDFFF\u0000","\u0061b":1,"":2}',
    '{"\uffff":1,"\U00010000":2,"\ue000":3,"\ud7ff":4,"\U0010ffff":5,"\u00e9":6,"e":7,"ee":8,"":9}',
    '{"a":{"a":1},"b":[{"a":1,"b":2},{"b":1,"a":2}],"c":{"c":{"c":{}}}}',  # a key again, in other objects
    # A small object whose key ids are past 255 (or 65535): ids as wide as the largest, not the count.
    '{"many":' + json.dumps({f"k{i}": i for i in range(300)}) + ',"small":{"new":1,"k0":2}}',
    '{"many":' + json.dumps({f"k{i}": i for i in range(70_000)}) + ',"small":{"new":1,"k0":2}}',
    b'{"a":1}\xff\xfe', b'{"a":1}\xed\xa0\x80', '{"a":1}}}', '{"a":1}{"b":2}', '{"a":1}  ,',
    b'\xef\xbb\xbf{"a":1}', '\ufeff{}',
    # 128 levels, the top object counted, and no more.
    deep(128), deep(127, "[]"), deep(127, "{}"), deep(128, "[]"), deep(129), deep(129) + "trailing",
    "{" * 5000 + "}" * 5000, '{"a":' + "[" * 5000 + "]" * 5000 + "}",
    # Refused: not JSON, duplicate keys (also through escapes), bad escapes and UTF-8, constants.
    '{"a":1,"\\u0061":2}', '{"a":{"b":1,"b":2}}', '{"x":[{"k":1,"k":1}]}', '{"a":"\\ud800"}', '{"a":"\\udc00"}',
    '{"a":"\\ud800\\u0041"}', '{"a":"\\ud800x"}', '{"a":"\\u12"}', '{"a":"\\u+123"}', '{"a":"\\u 123"}',
    '{"a":00.5}', '{"a":"\\x41"}', '{"a":"\\U0041"}', '{"a":"tab\there"}', '{"a":"nul\x00"}', '{"a":"del\x7f"}',
    b'{"a":"\xff"}', b'{"a":"\xc0\xaf"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf4\x90\x80\x80"}', b'{"\xe9":1}',
    b'{"a":"\xe2\x82"}', '{"a":NaN}', '{"a":Infinity}', '{"a":-Infinity}', '{"a":+1}', '{"a":.5}', '{"a":1.}',
    '{"a":1e}', '{"a":1e+}', '{"a":-}', '{"a":--1}', '{"a":0x10}', '{"a":1_0}', '{"a":tru}', '{"a":truex}',
    '{"a":nul}', '{"a":True}', "{'a':1}", '{"a":1,}', '{,}', '{"a":[1,,2]}', '{"a":[1 2]}', '{"a"::1}',
    '{"a":1', '{"a":"', "{", "\x0c{}", "\v{}", "\xa0{}", "\u3000{}", None, b"",
]]


def test_the_twin_encodes_every_vector_as_the_c_does() -> None:
    c = c_encoder()
    bodies = [v.encode() for v in VECTORS + NOT_OBJECTS + random_documents(400)] + EDGES
    assert_twin_matches_c(c, table_of(bodies))
    assert_twin_matches_c(c, table_of(bodies).slice(7, 300))  # a body column that starts past offset 0


def test_the_twin_and_the_c_agree_at_the_16_mib_limits() -> None:
    """Each part may be 16 MiB; a key or a string one byte longer than fits is no document, from either."""
    c = c_encoder()
    # metadata: 1 header byte, 3 x 3 bytes (count, two offsets), the key; value: 14 bytes around a string
    key_fits, string_fits = MAX_PART - 10, MAX_PART - 14
    bodies = [b'{"%s":1}' % (b"k" * key_fits), b'{"%s":1}' % (b"k" * (key_fits + 1)),
              b'{"s":"%s"}' % (b"s" * string_fits), b'{"s":"%s"}' % (b"s" * (string_fits + 1))]
    assert [d is not None for d in PyDocEncoder().column(table_of(bodies)).to_pylist()] == [True, False, True, False]
    assert_twin_matches_c(c, table_of(bodies))


def test_load_gives_an_encoder_under_every_switch(monkeypatch: pytest.MonkeyPatch, native_mode: str) -> None:
    """Never None: the C one when loaded, the twin under LOGJAM_NATIVE=off."""
    assert encoder() is not None
    monkeypatch.setenv(native.ENV, "off")
    assert isinstance(DocEncoder.load(), PyDocEncoder)


# Known answers (Parquet's VariantEncoding.md), so the twin is checked where there is no C too.
KNOWN: list[tuple[bytes, bytes | None, bytes | None]] = [
    (b"{}", b"\x02\x00\x00", b"\x01\x00\x00"),
    (b' {"a":1} tail', b"\x02\x01\x00\x00\x02\x0c\x01", b"\x01\x01\x00\x01a"),
    # ids and offsets in name order (a: id 1 at 1, b: id 0 at 0), values in document order
    (b'{"b":true,"a":null}', b"\x02\x02\x01\x00\x01\x00\x02\x04\x00", b"\x01\x02\x00\x01\x02ba"),
    # decimal4 150 scale 2, a double 1.0, an int16 300
    (b'{"d":1.50,"e":1e0,"i":300}', b"\x02\x03\x00\x01\x02\x00\x06\x0f\x12" + b"\x20\x02\x96\x00\x00\x00"
     + b"\x1c" + bytes.fromhex("000000000000f03f") + b"\x10\x2c\x01", b"\x01\x03\x00\x01\x02\x03dei"),
    (b'{"s":["x",[]]}', b"\x02\x01\x00\x00\x0a" + b"\x03\x02\x00\x02\x05" + b"\x05x" + b"\x03\x00\x00",
     b"\x01\x01\x00\x01s"),
    (b'{"a":1e400}', b"\x02\x01\x00\x00\x09\x1c" + bytes.fromhex("000000000000f07f"), b"\x01\x01\x00\x01a"),
    (b'{"a":1,"a":2}', None, None), (b"[1]", None, None), (b'{"a":"\\ud800"}', None, None),
]


def test_the_twin_gives_the_known_encodings() -> None:
    got = PyDocEncoder().column(table_of([body for body, _, _ in KNOWN])).to_pylist()
    for (body, value, metadata), doc in zip(KNOWN, got):
        assert (doc and (doc["value"], doc["metadata"])) == ((value, metadata) if value else None), body


# Generated JSON text (not Python values dumped): the encoding depends on the text of numbers
# (1.50 against 1.5e0), on whitespace, escapes and duplicate keys, which a dumper would normalize.
_BLANK = st.sampled_from(["", "", " ", "\n\t", " \r\n "])
_DIGITS = st.text("0123456789", min_size=1, max_size=45)


def _number(neg: bool, whole: str, fraction: str | None, exponent: str | None) -> str:
    return ("-" if neg else "") + (whole.lstrip("0") or "0") + ("." + fraction if fraction else "") + (exponent or "")


_NUMBERS = st.one_of(
    st.integers(-2**64, 2**64).map(str),
    st.sampled_from([2**k + d for k in (7, 15, 31, 63) for d in (-1, 0)])  # each width's edges, both signs
    .flatmap(lambda v: st.sampled_from([v, -v - 1])).map(str),
    st.integers(-10**45, 10**45).map(str),
    st.builds(_number, st.booleans(), _DIGITS, st.none() | _DIGITS,
              st.none() | st.from_regex(r"[eE][+-]?[0-9]{1,4}", fullmatch=True)),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
)
_KEY_CHARS = "ab\u00e9\ue000\uffff\U00010000\U0001f600\x00\"\\\n/"
_STRINGS = st.builds(lambda s, ascii_only: json.dumps(s, ensure_ascii=ascii_only),
                     st.text(max_size=10) | st.text(max_size=130) | st.sampled_from([63, 64, 255, 256, 70_000])
                     .map(lambda n: "é" * (n // 2) + "x" * (n % 2)), st.booleans()) \
    | st.sampled_from(['"\\/"', '"\\u00E9"', '"\\ud83d\\ude00"', '"\x7f"', '"\\u0000"', '"\\uDBFF\\uDFFF"'])
_BAD_SCALARS = st.sampled_from(['"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', '"\t"', "NaN", "tru", "01", "1."])
_KEYS = st.builds(lambda s, ascii_only: json.dumps(s, ensure_ascii=ascii_only),
                  st.text(_KEY_CHARS, min_size=1, max_size=4) | st.text(max_size=6), st.booleans())
_SCALARS = st.one_of(_NUMBERS, _STRINGS, st.sampled_from(["null", "true", "false"]))


def _container(kind: str, entries: list[str], blank: str) -> str:
    return (("{", "}") if kind == "o" else ("[", "]"))[0] + blank + f"{blank},{blank}".join(entries) + blank \
        + ("}" if kind == "o" else "]")


def _objects(values: st.SearchStrategy[str], duplicates: bool = False) -> st.SearchStrategy[str]:
    """Objects of distinct keys, or, with `duplicates`, sometimes a key twice (which refuses the document)."""
    pair = st.tuples(_KEYS, _BLANK, values)
    # Distinct by a map, not `unique_by`: its rejections make Hypothesis build this strategy's huge repr.
    entries = st.lists(pair, max_size=6).map(lambda p: list({json.loads(k): (k, b, v) for k, b, v in p}.values()))
    if duplicates:
        entries = entries | st.lists(pair, min_size=1, max_size=6).map(lambda p: [*p, p[0]])
    return st.builds(lambda entries, b: _container("o", [f"{k}{b}:{b}{v}" for k, b, v in entries], b), entries, _BLANK)


def _values(scalars: st.SearchStrategy[str], duplicates: bool = False) -> st.SearchStrategy[str]:
    return st.recursive(scalars, lambda inner: _objects(inner, duplicates) | st.builds(
        lambda items, b: _container("a", items, b), st.lists(inner, max_size=5), _BLANK), max_leaves=25)


def _wide(n: int, key_length: int, value_length: int, duplicate: bool, kind: str) -> str:
    """An object or array of `n` entries: counts past 255, offsets and ids past one and two bytes, and
    a small object after them whose ids are past 255."""
    value = json.dumps("v" * value_length)
    if kind == "a":
        return '{"a":' + _container("a", [value] * n, "") + "}"
    keys = [f'"{"k" * key_length}{i:05d}"' for i in range(n)] + (['"k00000"'] if duplicate else [])
    return _container("o", [f"{k}:{value}" for k in reversed(keys)] + ['"small":{"new":1}'], "")


_DOCUMENTS = st.one_of(
    st.builds(lambda b, doc, tail: b + doc + tail, _BLANK, _objects(_values(_SCALARS)),
              st.sampled_from(["", " x", "}", ",{"])).map(str.encode),
    # Bad values and duplicate keys somewhere among good ones (rarely: or most documents would hold one).
    _objects(_values(st.integers(0, 6).flatmap(lambda i: _SCALARS if i else _BAD_SCALARS), True), True).map(str.encode),
    st.builds(_wide, st.integers(200, 700), st.sampled_from([0, 1, 250]), st.sampled_from([0, 1, 200]), st.booleans(),
              st.sampled_from("oa")).map(str.encode),
    st.integers(120, 135).map(deep).map(str.encode),
)


@st.composite
def _damaged(draw: st.DrawFn) -> bytes:
    """A document with bytes cut, replaced or inserted somewhere: mostly no document, sometimes still one."""
    doc = draw(_DOCUMENTS)
    at = draw(st.integers(0, len(doc)))
    cut = draw(st.integers(0, 3))
    return doc[:at] + draw(st.binary(max_size=3)) + doc[at + cut:]


_BODIES = st.one_of(_DOCUMENTS, _damaged(), st.binary(max_size=200), st.just(None))


@settings(max_examples=500, deadline=None)
@given(st.lists(_BODIES, min_size=1, max_size=6), st.integers(0, 3))
def test_the_twin_and_the_c_give_the_same_arrays_for_any_body(bodies: list[bytes | None], skip: int) -> None:
    """Batches (the C reuses its buffers and key table from row to row), sliced or not."""
    c = c_encoder()
    table = table_of(bodies)
    assert_twin_matches_c(c, table)
    assert_twin_matches_c(c, table.slice(min(skip, len(bodies))))


def test_strings_with_a_stop_byte_at_every_offset_encode_as_the_twin_does() -> None:
    """native/lj_json.h `lj_plain_run` reads eight bytes a step: each byte it stops at, at every offset."""
    bodies = []
    for special in RUN_BYTES:
        for at in range(18):
            text = b"a" * at + special + b"b" * (17 - at)
            bodies.append(b'{"m":"' + text + b'","k' + text[:at] + b'":[1,"' + text + b'"]}')
    assert_twin_matches_c(c_encoder(), table_of(bodies))
