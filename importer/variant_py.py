"""The Python twin of native/variant.c: JSON bodies to Spark's VARIANT, byte for byte as the C does.

`PyDocEncoder` is what `DocEncoder.load()` (importer/variant.py) gives when the C module is
switched off (`LOGJAM_NATIVE=off`) or was not built, so the importer encodes `doc` either way.
Its rules are the C's (native/variant.c says why each is Spark's `parse_json`'s):

- a document only for a body that is, after blanks, one JSON object, strict RFC 8259 and
  well-formed UTF-8 inside it, at most 128 levels deep, with no key twice in one object;
  what follows the object is not read;
- an integer in the smallest of int8..int64, else a decimal(38) with scale 0; a number with a
  fraction and no exponent the narrowest of decimal4/8/16 that holds its significant digits
  and scale; anything else (an exponent, over 38 digits or a scale over 38) a double, rounded
  from the text as strtod rounds it;
- strings of up to 63 bytes short, longer ones as the long-string primitive;
- the metadata's dictionary in the order keys first appear (depth first, a key before its
  value), not marked sorted, offsets as wide as max(count, bytes) needs;
- an object's field ids and offsets ordered by name as Java orders strings (UTF-16 code
  units), its values left in document order;
- value and metadata each within 16 MiB.

Where the C and Spark differ, the twin does as the C: it is tested against the C byte for byte
(tests/test_variant.py), and the C against Spark. (Measured: Spark takes objects nested up to
1000 levels where the C stops at 128, and refuses an integer of over 1000 digits, which the C
makes a double.)

Parsing is the stdlib's C scanner (`json`), not orjson: the encoding depends on each number's
text ("1.50" is decimal(3,2), "1.5e0" a double), which only the stdlib's hooks hand over, and
orjson keeps the last of two equal keys where the encoding must refuse the document. So there
is no "orjson refused it, try again" step here as the C path has none: every body is parsed.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from json import JSONDecoder
from json.scanner import c_make_scanner
from typing import Any, Iterable

import pyarrow as pa

from table.schema import DOC_ARROW_TYPE

MAX_DEPTH = 128
MAX_PART = 16 << 20  # Spark's limit for a value and for its metadata
MAX_SHORT_STRING = 63
MAX_DECIMAL_DIGITS = 38

# Header bytes: (primitive type << 2) | basic type 0 (Parquet's VariantEncoding.md).
_NULL, _TRUE, _FALSE = b"\x00", b"\x04", b"\x08"
_INT8, _INT16, _INT32, _INT64, _DOUBLE = 3 << 2, 4 << 2, 5 << 2, 6 << 2, 7 << 2
_DECIMAL4, _DECIMAL8, _DECIMAL16 = 8 << 2, 9 << 2, 10 << 2
_LONG_STRING = 16 << 2
_SHORT_STRING, _OBJECT, _ARRAY = 1, 2, 3

_pack_i8 = struct.Struct("<Bb").pack
_pack_i16 = struct.Struct("<Bh").pack
_pack_i32 = struct.Struct("<Bi").pack
_pack_i64 = struct.Struct("<Bq").pack
_pack_double = struct.Struct("<Bd").pack
_pack_long_string = struct.Struct("<BI").pack

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_BLANKS = re.compile(r"[ \t\n\r]*")
_BIG_ENDIAN = sys.byteorder == "big"
# One short-string header per length, so that a string costs one concatenation.
_SHORT_HEADERS = [bytes((n << 2 | _SHORT_STRING,)) for n in range(MAX_SHORT_STRING + 1)]
if array("I").itemsize != 4:
    raise ImportError("importer.variant_py needs 4-byte array('I') words (_le)")


class _Refused(Exception):
    """The document is not encoded (the C's BAD): a duplicate key, too deep, NaN or Infinity."""


def _int_size(v: int) -> int:
    """Bytes for an offset, id or count of at most `v` (the C's int_size)."""
    return 1 if v <= 0xFF else 2 if v <= 0xFFFF else 3 if v <= 0xFFFFFF else 4


def _le(values: list[int], size: int) -> bytes:
    """`values` as `size`-byte little-endian unsigned integers, back to back."""
    if size == 1:
        return bytes(values)
    words = array("I", values)  # 4 bytes each (checked below), then cut to `size`
    if _BIG_ENDIAN:
        words.byteswap()
    raw = words.tobytes()
    if size == 4:
        return raw
    out = bytearray(size * len(values))
    for i in range(size):
        out[i::size] = raw[i::4]
    return bytes(out)


def _number_int(text: str) -> bytes:
    """An integer's text (the scanner's `parse_int`): the narrowest integer, else a decimal or double."""
    digits = text[1:] if text[0] == "-" else text
    if len(digits) <= 19:  # int() is safe before the length check only for short texts
        v = int(text)
        if -128 <= v <= 127:
            return _pack_i8(_INT8, v)
        if -32768 <= v <= 32767:
            return _pack_i16(_INT16, v)
        if -2147483648 <= v <= 2147483647:
            return _pack_i32(_INT32, v)
        if _I64_MIN <= v <= _I64_MAX:
            return _pack_i64(_INT64, v)
    return _decimal(text, digits, 0) or _double(text)


def _number_float(text: str) -> bytes:
    """A number's text with a fraction or an exponent (the scanner's `parse_float`)."""
    if "e" in text or "E" in text:
        return _double(text)
    digits = text[1:] if text[0] == "-" else text
    whole, _, fraction = digits.partition(".")
    return _decimal(text, whole + fraction, len(fraction)) or _double(text)


def _decimal(text: str, digits: str, scale: int) -> bytes | None:
    """`digits` (no sign, no point) with `scale` as the narrowest decimal, as BigDecimal(text) has it,
    or None past 38 significant digits or a scale past 38 (then it is a double, as in the C)."""
    significant = digits.lstrip("0")  # leading zeros (also after the point) are not significant
    precision = len(significant) or 1
    if precision > MAX_DECIMAL_DIGITS or scale > MAX_DECIMAL_DIGITS:
        return None
    v = int(significant) if significant else 0
    if text[0] == "-":
        v = -v  # "-0.0" stays 0: the C negates an unsigned zero
    if scale <= 9 and precision <= 9:
        return bytes((_DECIMAL4, scale)) + v.to_bytes(4, "little", signed=True)
    if scale <= 18 and precision <= 18:
        return bytes((_DECIMAL8, scale)) + v.to_bytes(8, "little", signed=True)
    return bytes((_DECIMAL16, scale)) + v.to_bytes(16, "little", signed=True)


def _double(text: str) -> bytes:
    # float() rounds correctly, as glibc's strtod does, and overflows to ±inf and under to ±0 alike.
    return _pack_double(_DOUBLE, float(text))


def _string(v: str) -> bytes:
    """A string value: short up to 63 bytes, else the long-string primitive."""
    b = v.encode()  # a lone surrogate (a bad \u escape or bad UTF-8) raises: refused, as in the C
    n = len(b)
    return _SHORT_HEADERS[n] + b if n <= MAX_SHORT_STRING else _pack_long_string(_LONG_STRING, n) + b


def _constant(name: str) -> Any:
    raise _Refused(name)  # NaN, Infinity, -Infinity: not JSON, and the C refuses them


# Objects come back as tuples of (key, value) pairs and arrays as lists; numbers as their
# encoding already. strict: a control character in a string is refused, as in the C. The C
# scanner (_json) only: json's pure-Python fallback reads \u escapes with int(x, 16), which
# takes "\u+1_2" that the C (and JSON) refuse.
if c_make_scanner is None:
    raise ImportError("importer.variant_py needs the stdlib's _json accelerator")
_scan = c_make_scanner(JSONDecoder(
    object_pairs_hook=tuple, parse_int=_number_int, parse_float=_number_float,
    parse_constant=_constant, strict=True))


class _Document:
    """One document's encoding: its key dictionary, filled as keys first appear."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}

    def value(self, v: Any, depth: int) -> bytes:
        """The encoding of a parsed value; `depth` counts the containers around it."""
        t = type(v)
        if t is bytes:
            return v  # a number, encoded by the scanner's hooks
        if t is str:
            return _string(v)
        if t is tuple:
            return self.object(v, depth + 1)
        if t is list:
            return self.array(v, depth + 1)
        return _TRUE if v is True else _FALSE if v is False else _NULL

    def object(self, pairs: tuple[tuple[str, Any], ...], depth: int) -> bytes:
        """An object: header (ids and offsets in Java's order of the names), then values in document order."""
        if depth > MAX_DEPTH:
            raise _Refused("deeper than 128")
        keys, ids, offsets, parts, size = self.keys, [], [], [], 0
        for name, v in pairs:
            key_id = keys.get(name)
            if key_id is None:  # interned before its value is read, as the C does
                key_id = keys[name] = len(keys)
            ids.append(key_id)
            offsets.append(size)
            # Numbers and strings inline: they are most of a log line's values.
            b = v if type(v) is bytes else _string(v) if type(v) is str else self.value(v, depth)
            parts.append(b)
            size += len(b)
        n = len(ids)
        if len(set(ids)) != n:
            raise _Refused("duplicate key")  # parse_json refuses a key twice in one object
        if n > 1:
            names = [name for name, _ in pairs]
            # Code point order is Java's (UTF-16 units) unless a name has a character past U+FFFF;
            # names are distinct here, so the tuples compare by name alone.
            if not "".join(names).isascii():
                names = [name.encode("utf-16-be") for name in names]
            fields = sorted(zip(names, ids, offsets))
            ids = [f[1] for f in fields]
            offsets = [f[2] for f in fields]
        max_id = max(ids, default=0)
        if n <= 0xFF and max_id <= 0xFF and size <= 0xFF:  # a log line's usual object: one-byte everything
            return b"".join((bytes((_OBJECT, n, *ids, *offsets, size)), *parts))
        id_size, off_size, large = _int_size(max_id), _int_size(size), n > 0xFF
        offsets.append(size)
        return b"".join((bytes((large << 6 | (id_size - 1) << 4 | (off_size - 1) << 2 | _OBJECT,)),
                         n.to_bytes(4 if large else 1, "little"), _le(ids, id_size), _le(offsets, off_size),
                         *parts))

    def array(self, items: list[Any], depth: int) -> bytes:
        """An array: header (element offsets), then the elements."""
        if depth > MAX_DEPTH:
            raise _Refused("deeper than 128")
        offsets, parts, size = [], [], 0
        for v in items:
            offsets.append(size)
            b = v if type(v) is bytes else _string(v) if type(v) is str else self.value(v, depth)
            parts.append(b)
            size += len(b)
        n = len(items)
        if n <= 0xFF and size <= 0xFF:
            return b"".join((bytes((_ARRAY, n, *offsets, size)), *parts))
        off_size, large = _int_size(size), n > 0xFF
        offsets.append(size)
        return b"".join((bytes((large << 4 | (off_size - 1) << 2 | _ARRAY,)), n.to_bytes(4 if large else 1, "little"),
                         _le(offsets, off_size), *parts))

    def metadata(self) -> bytes:
        """Version 1, not sorted: the keys in the order they first appeared."""
        names = [k.encode() for k in self.keys]
        offsets, at = [], 0
        for name in names:
            offsets.append(at)
            at += len(name)
        offsets.append(at)
        n = len(names)
        size = _int_size(max(n, at))
        return b"".join((bytes((1 | (size - 1) << 6,)), _le([n], size), _le(offsets, size), *names))


def encode(body: bytes) -> tuple[bytes, bytes] | None:
    """(value, metadata) of one body, or None where the C gives no document."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        # Bad UTF-8 after the object is not read, so it must not refuse the body; inside a
        # string it becomes a lone surrogate, which encoding the string refuses.
        text = body.decode("utf-8", "surrogateescape")
    start = 0 if text[:1] == "{" else _BLANKS.match(text).end()
    if text[start:start + 1] != "{":
        return None  # objects only (table/schema.py says why)
    try:
        parsed, _ = _scan(text, start)  # what follows the object is not read, as Spark does not
        doc = _Document()
        value = doc.object(parsed, 1)
        metadata = doc.metadata()
    except (ValueError, StopIteration, RecursionError, _Refused):
        return None  # ValueError covers JSONDecodeError and UnicodeEncodeError (lone surrogates)
    if len(value) > MAX_PART or len(metadata) > MAX_PART:
        return None
    return value, metadata


class PyDocEncoder:
    """`DocEncoder`'s interface over `encode`: a table's bodies to the `doc` column."""

    def column(self, table: pa.Table) -> pa.StructArray:
        """`doc` for every row of `table`: NULL where the body is not one JSON object.

        `parse_error` is not read: every body is parsed here, as in the C."""
        body = table.column("body")
        body = body.cast(pa.large_binary() if pa.types.is_large_string(body.type) else pa.binary())
        return doc_array(body.to_pylist())


def doc_array(bodies: Iterable[bytes | None]) -> pa.StructArray:
    """The `doc` array of `bodies` laid out as the C lays it out: a NULL row holds no bytes."""
    values: list[bytes] = []
    metas: list[bytes] = []
    valid: list[bool] = []
    for body in bodies:
        got = encode(body) if body is not None else None
        valid.append(got is not None)
        values.append(got[0] if got is not None else b"")
        metas.append(got[1] if got is not None else b"")
    rows = len(valid)
    # A boolean array's values are the validity bitmap itself (LSB first, as the C's).
    validity = pa.array(valid, pa.bool_()).buffers()[1] if rows else None
    return pa.Array.from_buffers(DOC_ARROW_TYPE, rows, [validity], null_count=rows - sum(valid),
                                 children=[pa.array(metas, pa.large_binary()), pa.array(values, pa.large_binary())])
