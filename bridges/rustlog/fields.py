"""RustLog's field types, one small class per kind of value, for both dialects.

A request or response is described by a schema (codec.py): its fields, each with one of
the types below, once for the binary dialect (wire order) and once for the JSON dialect
(object keys). The segment protocol's fields.py and kafka-python's `kafka/protocol/types.py`
are the model. A binary type reads its value from a `Reader` and appends its bytes to a
list; a JSON type gets its value out of the decoded object and puts it into the one being
built. Every limit is checked against a length field before anything is sliced, decoded
or allocated for it.

A value that breaks its type raises `InvalidField`: the server answers the request with
`Error(kind)` and keeps the connection; the client reports a `MalformedResponse`.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any, Callable, Mapping, Protocol

from logjam.errors import LocalProtocolError, RemoteProtocolError

from bridges.rustlog.messages import U16, U32, U64, ErrorKind, FetchedRecord

TOPIC_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}\Z")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_REQUIRED: Any = object()  # a JSON field's default when it has none


class InvalidField(RemoteProtocolError):
    """A field of a well-framed payload is invalid; not fatal to the connection."""

    reason = "bad_request"

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.kind = kind


def check_topic(topic: str) -> str:
    if not TOPIC_NAME.match(topic):
        raise InvalidField(f"invalid topic name {topic[:80]!r}: 1-255 characters from [A-Za-z0-9_-]")
    return topic


# ---------------------------------------------------------------- binary dialect


class Reader:
    """A cursor over one binary payload (after its type byte); running past the end is an `InvalidField`."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 1) -> None:
        self.data = data
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> int:
        """Claim the next `n` bytes; returns where they start."""
        start = self.pos
        if start + n > len(self.data):
            raise InvalidField(f"truncated payload: wanted {n} bytes at {start}, payload is {len(self.data)}")
        self.pos = start + n
        return start

    def end(self) -> None:
        if self.pos != len(self.data):
            raise InvalidField(f"{len(self.data) - self.pos} unexpected bytes after the payload")


class BinaryField(Protocol):
    """A schema entry of the binary dialect. `min_size` bounds a count before its items are read."""

    min_size: int

    def read(self, r: Reader) -> Any: ...

    def write(self, value: Any, out: list[bytes]) -> None: ...


class _Int:
    """A big-endian unsigned integer; with `clamp`, larger values are written as the maximum."""

    __slots__ = ("min_size", "_struct", "_max", "_clamp")

    def __init__(self, fmt: str, clamp: bool = False) -> None:
        self._struct = struct.Struct(fmt)
        self.min_size = self._struct.size
        self._max = 2 ** (8 * self.min_size) - 1
        self._clamp = clamp

    def read(self, r: Reader) -> int:
        return self._struct.unpack_from(r.data, r.take(self.min_size))[0]

    def write(self, value: int, out: list[bytes]) -> None:
        try:
            out.append(self._struct.pack(min(value, self._max) if self._clamp else value))
        except struct.error:
            message = f"{value!r} does not fit {self.min_size} unsigned bytes"
            raise LocalProtocolError(message, reason="bad_field") from None


class _ErrorCode:
    """An error kind, written as its u16 binary code (the client reads the code with `UInt16`)."""

    min_size = 2

    def read(self, r: Reader) -> ErrorKind:
        raise LocalProtocolError("an error kind is written, never read; ErrorReply carries the code")

    def write(self, value: ErrorKind, out: list[bytes]) -> None:
        out.append(_U16.pack(value.binary_code))


class _Flag:
    """A u8 that is true when 1."""

    min_size = 1

    def read(self, r: Reader) -> bool:
        return r.data[r.take(1)] == 1

    def write(self, value: bool, out: list[bytes]) -> None:
        out.append(b"\x01" if value else b"\x00")


class _OptionalUInt64:
    """A u8 presence flag (1: present), then a u64 when present."""

    min_size = 1

    def read(self, r: Reader) -> int | None:
        return UInt64.read(r) if r.data[r.take(1)] == 1 else None

    def write(self, value: int | None, out: list[bytes]) -> None:
        if value is None:
            out.append(b"\x00")
        else:
            out.append(b"\x01")
            UInt64.write(value, out)


class _Str:
    """A u16 byte length, then UTF-8; `topic` also checks the topic-name rule on input."""

    __slots__ = ("_topic",)
    min_size = 2

    def __init__(self, topic: bool = False) -> None:
        self._topic = topic

    def read(self, r: Reader) -> str:
        data = r.data
        n = _U16.unpack_from(data, r.take(2))[0]
        start = r.take(n)
        try:
            text = data[start:start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            # The reference answers decode error 2 here and keeps the connection.
            raise InvalidField(f"string is not UTF-8: {e.reason}") from None
        return check_topic(text) if self._topic else text

    def write(self, value: str, out: list[bytes]) -> None:
        raw = value.encode("utf-8")[:U16]
        out.append(_U16.pack(len(raw)))
        out.append(raw)


class ByteList:
    """A u32 count, then per item a u32 length and that many bytes; both bounded before reading."""

    __slots__ = ("_max_items", "_max_item")
    min_size = 4

    def __init__(self, max_items: int, max_item: int) -> None:
        self._max_items = max_items
        self._max_item = max_item

    def read(self, r: Reader) -> tuple[bytes, ...]:
        data = r.data
        count = _U32.unpack_from(data, r.take(4))[0]
        if count > self._max_items:
            raise InvalidField(f"{count} records in one batch; at most {self._max_items}")
        max_item, unpack, out = self._max_item, _U32.unpack_from, []
        pos, end = r.pos, len(data)
        for i in range(count):
            if pos + 4 > end:
                raise InvalidField("truncated byte list")
            n = unpack(data, pos)[0]
            pos += 4
            if n > max_item:
                raise InvalidField(f"record {i} is {n} bytes; at most {max_item}", ErrorKind.RECORD_TOO_LARGE)
            if pos + n > end:
                raise InvalidField("truncated byte list")
            out.append(data[pos:pos + n])
            pos += n
        r.pos = pos
        return tuple(out)

    def write(self, value: tuple[bytes, ...] | list[bytes], out: list[bytes]) -> None:
        pack = _U32.pack
        out.append(pack(len(value)))
        for item in value:
            out.append(pack(len(item)))
            out.append(item)


class _FetchedPayloads:
    """Fetched records as a byte list of their payloads (the binary dialect has no offsets or timestamps)."""

    min_size = 4
    _list = ByteList(U32, U32)

    def read(self, r: Reader) -> tuple[FetchedRecord, ...]:
        return tuple(FetchedRecord(p) for p in self._list.read(r))

    def write(self, value: tuple[FetchedRecord, ...], out: list[bytes]) -> None:
        self._list.write([rec.payload for rec in value], out)


class BinaryStruct:
    """A dataclass whose fields follow one another (an array item, say)."""

    __slots__ = ("cls", "fields", "min_size")

    def __init__(self, cls: type, fields: tuple[tuple[str, BinaryField], ...]) -> None:
        self.cls = cls
        self.fields = fields
        self.min_size = sum(f.min_size for _, f in fields)

    def read(self, r: Reader) -> Any:
        return self.cls(**{name: f.read(r) for name, f in self.fields})

    def write(self, value: Any, out: list[bytes]) -> None:
        for name, f in self.fields:
            f.write(getattr(value, name), out)


class Array:
    """A u32 count, then that many items; the count is checked against the bytes left first."""

    __slots__ = ("item",)
    min_size = 4

    def __init__(self, item: BinaryStruct) -> None:
        self.item = item

    def read(self, r: Reader) -> tuple[Any, ...]:
        count = UInt32.read(r)
        if count * self.item.min_size > r.remaining:
            raise InvalidField(f"{count} items cannot fit in the {r.remaining} bytes left")
        return tuple(self.item.read(r) for _ in range(count))

    def write(self, value: tuple[Any, ...], out: list[bytes]) -> None:
        UInt32.write(len(value), out)
        for item in value:
            self.item.write(item, out)


class Absent:
    """A field this dialect does not carry: nothing on the wire, `value` when read."""

    __slots__ = ("value",)
    min_size = 0

    def __init__(self, value: Any) -> None:
        self.value = value

    def read(self, r: Reader) -> Any:
        return self.value

    def write(self, value: Any, out: list[bytes]) -> None:
        pass


# Whole-message types: a schema lists them under the name None. `write` gets the message
# itself, and `read` returns a mapping of the fields it `provides` (possibly none).


class CountOf:
    """A u32 count of another field's items that the wire repeats; read and ignored."""

    __slots__ = ("attr",)
    min_size = 4
    provides: tuple[str, ...] = ()

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def read(self, r: Reader) -> Mapping[str, Any]:
        UInt32.read(r)
        return {}

    def write(self, message: Any, out: list[bytes]) -> None:
        UInt32.write(len(getattr(message, self.attr)), out)


class MetricsText:
    """Prometheus text with a u32 length; read, it is also parsed into the metrics' values."""

    __slots__ = ("parse",)
    min_size = 4
    provides = ("text", "values")

    def __init__(self, parse: Callable[[str], dict[str, float]]) -> None:
        self.parse = parse

    def read(self, r: Reader) -> Mapping[str, Any]:
        n = UInt32.read(r)
        start = r.take(n)
        text = r.data[start:start + n].decode("utf-8", "replace")
        return {"text": text, "values": self.parse(text)}

    def write(self, message: Any, out: list[bytes]) -> None:
        raw = message.text.encode("utf-8")
        UInt32.write(len(raw), out)
        out.append(raw)


UInt16 = _Int(">H")
UInt32 = _Int(">I")
UInt32Clamped = _Int(">I", clamp=True)
UInt64 = _Int(">Q")
Flag = _Flag()
OptionalUInt64 = _OptionalUInt64()
Str = _Str()
Topic = _Str(topic=True)
ErrorCode = _ErrorCode()
FetchedPayloads = _FetchedPayloads()



# ---------------------------------------------------------------- JSON dialect


class JsonField(Protocol):
    """A schema entry of the JSON dialect: `get` from the received object, `put` into the one sent."""

    def get(self, obj: Mapping[str, Any], key: str) -> Any: ...

    def put(self, out: dict[str, Any], key: str, value: Any) -> None: ...


class _JsonValue:
    """A value stored as is under its key (`put` is shared); subclasses check it on `get`."""

    __slots__ = ("default",)

    def __init__(self, default: Any = _REQUIRED) -> None:
        self.default = default

    def _missing(self, key: str) -> Any:
        if self.default is _REQUIRED:
            raise InvalidField(f"field {key!r} is missing")
        return self.default

    def put(self, out: dict[str, Any], key: str, value: Any) -> None:
        out[key] = value


class JInt(_JsonValue):
    """An integer in 0..limit (true and false are not integers); `nullable` also takes null."""

    __slots__ = ("limit", "nullable")

    def __init__(self, limit: int, default: Any = _REQUIRED, nullable: bool = False) -> None:
        super().__init__(default)
        self.limit = limit
        self.nullable = nullable

    def get(self, obj: Mapping[str, Any], key: str) -> int | None:
        value = obj.get(key, self)
        if value is self:
            return self._missing(key)
        if value is None and self.nullable:
            return None
        if type(value) is not int or not 0 <= value <= self.limit:
            raise InvalidField(f"field {key!r} must be an integer in 0..{self.limit}")
        return value


class JStr(_JsonValue):
    """A string; `topic` also checks the topic-name rule."""

    __slots__ = ("topic",)

    def __init__(self, default: Any = _REQUIRED, topic: bool = False) -> None:
        super().__init__(default)
        self.topic = topic

    def get(self, obj: Mapping[str, Any], key: str) -> str:
        value = obj.get(key, self)
        if value is self:
            value = self._missing(key)
        if not isinstance(value, str):
            raise InvalidField(f"field {key!r} must be a string")
        return check_topic(value) if self.topic else value


class JBool(_JsonValue):
    __slots__ = ()

    def get(self, obj: Mapping[str, Any], key: str) -> bool:
        value = obj.get(key, self)
        if value is self:
            return self._missing(key)
        if not isinstance(value, bool):
            raise InvalidField(f"field {key!r} must be true or false")
        return value


class JAny(_JsonValue):
    """Any JSON value (an error's details)."""

    __slots__ = ()

    def get(self, obj: Mapping[str, Any], key: str) -> Any:
        return obj.get(key, self.default)


class _JErrorCode:
    """An error kind, sent as its JSON code under "code" (the client reads the code with `JInt`)."""

    def get(self, obj: Mapping[str, Any], key: str) -> ErrorKind:
        raise LocalProtocolError("an error kind is sent, never read; ErrorReply carries the code")

    def put(self, out: dict[str, Any], key: str, value: ErrorKind) -> None:
        out["code"] = value.json_code


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_length(size: int) -> int:
    """The length of the Base64 text of `size` bytes: a longer text is invalid or decodes to more."""
    return 4 * -(-size // 3)


def _unb64(text: Any, i: int, max_size: int) -> bytes:
    """One Base64 record; its length is bounded before it is decoded."""
    if not isinstance(text, str):
        raise InvalidField(f"record {i} must be a Base64 string")
    if len(text) > _b64_length(max_size):
        raise InvalidField(f"record {i} is over {max_size} bytes", ErrorKind.RECORD_TOO_LARGE)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidField(f"record {i} is not valid Base64") from None
    if len(data) > max_size:
        raise InvalidField(f"record {i} is {len(data)} bytes; at most {max_size}", ErrorKind.RECORD_TOO_LARGE)
    return data


class JRecords:
    """An array of Base64 strings, at most `max_items` of at most `max_item` bytes each."""

    __slots__ = ("max_items", "max_item")

    def __init__(self, max_items: int, max_item: int) -> None:
        self.max_items = max_items
        self.max_item = max_item

    def get(self, obj: Mapping[str, Any], key: str) -> tuple[bytes, ...]:
        value = obj.get(key)
        if not isinstance(value, list):
            raise InvalidField(f"field {key!r} must be an array of Base64 strings")
        if len(value) > self.max_items:
            raise InvalidField(f"{len(value)} records in one batch; at most {self.max_items}")
        # One loop, not a call of _unb64 per record: this is the JSON Produce's hot path.
        max_item, longest, b64, out = self.max_item, _b64_length(self.max_item), base64.b64decode, []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise InvalidField(f"record {i} must be a Base64 string")
            if len(item) > longest:
                raise InvalidField(f"record {i} is over {max_item} bytes", ErrorKind.RECORD_TOO_LARGE)
            try:
                data = b64(item, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidField(f"record {i} is not valid Base64") from None
            if len(data) > max_item:
                raise InvalidField(f"record {i} is {len(data)} bytes; at most {max_item}", ErrorKind.RECORD_TOO_LARGE)
            out.append(data)
        return tuple(out)

    def put(self, out: dict[str, Any], key: str, value: tuple[bytes, ...]) -> None:
        out[key] = [_b64(r) for r in value]


class _JFetchedRecords:
    """Fetched records as objects with their offset, timestamp and Base64 payload."""

    _offset = JInt(U64)

    def get(self, obj: Mapping[str, Any], key: str) -> tuple[FetchedRecord, ...]:
        items = obj.get(key)
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise InvalidField(f"field {key!r} must be an array of records")
        offset = self._offset.get
        return tuple(
            FetchedRecord(_unb64(item.get("payload"), i, U32), offset(item, "offset"), offset(item, "timestamp"))
            for i, item in enumerate(items)
        )

    def put(self, out: dict[str, Any], key: str, value: tuple[FetchedRecord, ...]) -> None:
        out[key] = [{"offset": r.offset, "timestamp": r.timestamp, "payload": _b64(r.payload)} for r in value]


class JStruct:
    """A dataclass as a JSON object of its fields."""

    __slots__ = ("cls", "fields")

    def __init__(self, cls: type, fields: tuple[tuple[str, JsonField], ...]) -> None:
        self.cls = cls
        self.fields = fields

    def from_obj(self, obj: Any) -> Any:
        if not isinstance(obj, dict):
            raise InvalidField(f"a {self.cls.__name__} must be a JSON object")
        return self.cls(**{name: f.get(obj, name) for name, f in self.fields})

    def to_obj(self, value: Any, out: dict[str, Any]) -> dict[str, Any]:
        for name, f in self.fields:
            f.put(out, name, getattr(value, name))
        return out


class JArray:
    """An array of `JStruct` objects."""

    __slots__ = ("item",)

    def __init__(self, item: JStruct) -> None:
        self.item = item

    def get(self, obj: Mapping[str, Any], key: str) -> tuple[Any, ...]:
        value = obj.get(key)
        if not isinstance(value, list):
            raise InvalidField(f"field {key!r} must be an array")
        return tuple(self.item.from_obj(v) for v in value)

    def put(self, out: dict[str, Any], key: str, value: tuple[Any, ...]) -> None:
        out[key] = [self.item.to_obj(v, {}) for v in value]


class JInline:
    """A `JStruct` whose fields sit in the enclosing object itself, not under their own key."""

    __slots__ = ("item",)

    def __init__(self, item: JStruct) -> None:
        self.item = item

    def get(self, obj: Mapping[str, Any], key: str) -> Any:
        return self.item.from_obj(obj)

    def put(self, out: dict[str, Any], key: str, value: Any) -> None:
        self.item.to_obj(value, out)


class _JOtherKeys:
    """Every key of the object but "type", as a mapping (MetricsFetch's counters)."""

    def get(self, obj: Mapping[str, Any], key: str) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if k != "type"}

    def put(self, out: dict[str, Any], key: str, value: Mapping[str, Any]) -> None:
        for k, v in value.items():
            if k != "type":
                out[k] = v


JErrorCode = _JErrorCode()
JFetchedRecords = _JFetchedRecords()
JOtherKeys = _JOtherKeys()
