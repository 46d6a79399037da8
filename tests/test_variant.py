"""native/variant.c (importer/variant.py) against Spark's own parse_json, byte for byte.

The importer stages `doc` encoded by the C module; without it Spark parses the body in the
write. Both must give the same VARIANT, so each vector's bytes from the C encoder are compared
with the bytes Spark writes for `try_parse_json(body)` (unshredded), and Spark must read the
encoder's output back as the same JSON. Vectors: one of each shape the encoding has (integer
widths, decimals, doubles, short and long strings, escapes and surrogate pairs, keys Java
orders differently from UTF-8, objects and arrays past 255 entries and offsets past 64 KiB),
then random documents. Bodies that are not one JSON object get no `doc`, from either.
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

from importer.variant import DocEncoder
from table.schema import DOC_EXPR, staged_ddl
from importer.decode import BatchBuilder

pytestmark = [pytest.mark.timeout(300)]

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


def encoded(table: pa.Table) -> list[tuple[bytes, bytes] | None]:
    encoder = DocEncoder.load()
    assert encoder is not None, "the C module was not built"
    return [None if d is None else (d["value"], d["metadata"]) for d in encoder.column(table).to_pylist()]


def sparks(spark: Any, tmp: Path, table: pa.Table) -> list[tuple[bytes, bytes] | None]:
    """What Spark writes, unshredded, for `DOC_EXPR` over the same bodies, as the Parquet bytes."""
    source, out = tmp / f"in-{uuid.uuid4().hex}.parquet", tmp / f"out-{uuid.uuid4().hex}"
    pq.write_table(table.select(["seq", "body"]), source)
    spark.conf.set("spark.sql.variant.writeShredding.enabled", "false")
    spark.read.parquet(f"file://{source}").selectExpr("seq", f"{DOC_EXPR} AS doc").coalesce(1) \
        .write.parquet(f"file://{out}")
    rows = pq.read_table(out).sort_by("seq").column("doc").to_pylist()
    return [None if d is None else (d["value"], d["metadata"]) for d in rows]


def read_back(spark: Any, tmp: Path, table: pa.Table) -> list[tuple[str | None, str | None]]:
    """(`to_json` of the encoder's `doc` read as a staged file is, `to_json(try_parse_json(body))`) per row."""
    path = tmp / f"staged-{uuid.uuid4().hex}.parquet"
    pq.write_table(table.append_column("doc", DocEncoder.load().column(table)), path)
    rows = spark.read.schema(staged_ddl()).parquet(f"file://{path}") \
        .selectExpr("seq", "to_json(doc)", "to_json(try_parse_json(body))").orderBy("seq").collect()
    return [(r[1], r[2]) for r in rows]


@pytest.fixture()
def spark(spark_server: Any) -> Any:
    session = spark_server.session()  # shared by the test session: settings changed here are undone
    yield session
    session.conf.unset("spark.sql.variant.writeShredding.enabled")


def test_every_vector_encodes_to_the_bytes_spark_writes(spark: Any, tmp_path: Path) -> None:
    bodies = [v.encode() for v in VECTORS + NOT_OBJECTS + random_documents(400)]
    table = staged(bodies)
    ours, theirs = encoded(table), sparks(spark, tmp_path, table)
    for body, a, b in zip(bodies, ours, theirs):
        assert a == b, body[:200]
    assert all(d is not None for d in ours[:len(VECTORS)])
    assert all(d is None for d in ours[len(VECTORS):len(VECTORS) + len(NOT_OBJECTS)])


def test_spark_reads_the_encoded_doc_back_as_the_same_json(spark: Any, tmp_path: Path) -> None:
    bodies = [v.encode() for v in VECTORS + random_documents(100)]
    table = staged(bodies)
    back = read_back(spark, tmp_path, table)
    for body, (ours, theirs) in zip(bodies, back):
        assert ours == theirs, body[:200]
    assert all(ours is not None for ours, _ in back[:len(VECTORS)])
    assert sum(ours is not None for ours, _ in back) >= 0.9 * len(back)


def test_lookups_in_large_objects_find_every_field(spark: Any, tmp_path: Path) -> None:
    """Spark binary-searches an object of 32 fields or more by name in Java's order."""
    keys = [f"k{i}" for i in range(40)] + ["\ue000", "\U0001f600", "é", "\uffff"]
    table = staged([json.dumps({k: i for i, k in enumerate(keys)}).encode()])
    path = tmp_path / "large.parquet"
    pq.write_table(table.append_column("doc", DocEncoder.load().column(table)), path)
    df = spark.read.schema(staged_ddl()).parquet(f"file://{path}")
    exprs = [f"variant_get(doc, '$[\"{k}\"]', 'int')" for k in keys]
    assert list(df.selectExpr(*exprs).collect()[0]) == list(range(len(keys)))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(alphabet='{}[]":,\\ 0123456789.eE+-tfnul"abu\u00e9', max_size=80)
       .map(str.encode) | st.dictionaries(st.text(max_size=4), st.recursive(
           st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
           max_leaves=10)).map(orjson.dumps))
def test_arbitrary_bytes_yield_a_document_or_none(body: bytes) -> None:
    """A document only for a body that starts with a JSON object, and always for a valid one."""
    table = pa.table({"body": pa.array([body], pa.binary()).cast(pa.string(), safe=False),
                      "parse_error": pa.nulls(1, pa.string())})
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
