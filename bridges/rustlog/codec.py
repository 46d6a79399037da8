"""RustLog on the wire: framing, one declarative schema per request and response, one codec.

A `Schema` names a message class, its binary type byte, its JSON "type" and its fields in
each dialect, with the types of fields.py; `encode`, `decode_request` and `decode_response`
are the one encoder and decoder, and no message carries code of its own (the segment
protocol's commands.py is the model). `_register` checks every schema against its class
when this module is imported, so a schema cannot drift from the dataclass it builds.

The engine halves (engine.py) call these; nothing here does I/O or keeps state but the
framer's buffer. Server side, an invalid field is an `InvalidField` (the request is
answered with an error and the connection goes on), while malformed JSON, invalid UTF-8
in a JSON payload and bad framing are fatal. Client side, anything undecodable is a
`MalformedResponse`.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from logjam.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError

from bridges.rustlog.fields import (
    Absent, Array, BinaryField, BinaryStruct, ByteList, CountOf, ErrorCode, FetchedPayloads, Flag, InvalidField, JAny,
    JArray, JBool, JErrorCode, JFetchedRecords, JInline, JInt, JOtherKeys, JRecords, JsonField, JStr, JStruct,
    MetricsText, OptionalUInt64, Reader, Str, Topic, UInt16, UInt32, UInt32Clamped, UInt64,
)
from bridges.rustlog.messages import (
    DEFAULT_FETCH_MAX_BYTES, MAX_RECORD_SIZE, MAX_RECORDS_PER_BATCH, U32, U64, CreateTopic, CreateTopicResponse,
    DescribePartition, DescribePartitionResponse, DescribeTopic, DescribeTopicResponse, Dialect, EmptyFrame, Error,
    ErrorReply, Fetch, FetchResponse, InvalidUtf8, ListTopics, ListTopicsResponse, MalformedJson, MalformedResponse,
    MetricsFetch, MetricsResponse, OffsetCommit, OffsetCommitResponse, OffsetFetch, OffsetFetchResponse,
    PartitionInfo, Ping, Pong, Produce, ProduceResponse, Request, Response, TopicInfo,
)
from bridges.rustlog.prometheus import parse_prometheus

_LEN = struct.Struct(">I")
BRACE = ord("{")  # the first byte of every JSON payload; any other first byte is a binary type

# ---------------------------------------------------------------- framing


class Framer:
    """Splits a byte stream into payloads; the length is checked before the payload is buffered."""

    __slots__ = ("max_frame", "_buf", "_pos", "_need")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0
        self._need: int | None = None

    def feed(self, data: bytes) -> tuple[list[bytes], RemoteProtocolError | None]:
        """Complete payloads, and the framing error that stopped the split (if any).

        Payloads before a bad header are returned so that their requests are still
        answered; nothing after the bad header is looked at.
        """
        self._buf += data
        buf = self._buf
        out: list[bytes] = []
        error: RemoteProtocolError | None = None
        with memoryview(buf) as view:
            while True:
                avail = len(buf) - self._pos
                if self._need is None:
                    if avail < 4:
                        break
                    n = _LEN.unpack_from(buf, self._pos)[0]
                    try:
                        self._check(n)
                    except RemoteProtocolError as e:
                        error = e
                        break
                    self._need = n
                    self._pos += 4
                    avail -= 4
                if avail < self._need:
                    break
                start = self._pos
                self._pos += self._need
                self._need = None
                out.append(bytes(view[start:self._pos]))
        if self._pos and error is None:
            del buf[:self._pos]
            self._pos = 0
        return out, error

    def _check(self, n: int) -> None:
        if n == 0:
            raise EmptyFrame("zero-length frame; closing as the spec requires")
        if n > self.max_frame:
            raise FrameTooLarge(f"frame of {n} bytes exceeds the maximum of {self.max_frame}")

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def peek_first_payload_byte(self) -> int | None:
        """The dialect byte of the frame being read, when it has arrived."""
        i = self._pos + 4
        return self._buf[i] if len(self._buf) > i else None


def frame(payload: bytes) -> bytes:
    """A payload with its 4-byte big-endian length."""
    return _LEN.pack(len(payload)) + payload


def dialect_of(first_byte: int) -> Dialect:
    return Dialect.JSON if first_byte == BRACE else Dialect.BINARY


# ---------------------------------------------------------------- schemas

BinaryLayout = tuple[tuple[str | None, BinaryField], ...]  # None: a whole-message type (CountOf, MetricsText)
JsonLayout = tuple[tuple[str, JsonField], ...]


@dataclass(frozen=True, slots=True)
class Schema:
    """One message in both dialects: the class it builds, its type byte and name, its fields.

    A field missing from one dialect's layout takes the class's default when decoded.
    """

    cls: type
    code: int
    name: str
    binary: BinaryLayout = ()
    json: JsonLayout = ()
    tag: bytes = field(init=False)  # the type byte, as bytes
    with_dialect: bool = field(init=False)  # the class records the dialect a message came in

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag", bytes([self.code]))
        object.__setattr__(self, "with_dialect", "dialect" in {f.name for f in dataclasses.fields(self.cls)})


_PARTITION = BinaryStruct(PartitionInfo, (("partition", UInt32), ("high_watermark", UInt64)))
_J_PARTITION = JStruct(PartitionInfo, (
    ("partition", JInt(U32)), ("high_watermark", JInt(U64)),
    ("log_start_offset", JInt(U64, None, nullable=True)), ("segment_count", JInt(U64, None, nullable=True)),
))
_J_TOPIC = JStr(topic=True)
_J_PARTITION_NO = JInt(U32)
_BATCH = (MAX_RECORDS_PER_BATCH, MAX_RECORD_SIZE)  # records in a Produce, bytes in a record

REQUESTS = (
    Schema(Produce, 0x01, "Produce",
           (("topic", Topic), ("partition", UInt32), ("records", ByteList(*_BATCH))),
           (("topic", _J_TOPIC), ("partition", _J_PARTITION_NO), ("records", JRecords(*_BATCH)))),
    Schema(Fetch, 0x02, "Fetch",
           (("group_id", Str), ("topic", Topic), ("partition", UInt32), ("offset", UInt64),
            ("max_bytes", UInt32Clamped)),
           (("topic", _J_TOPIC), ("partition", _J_PARTITION_NO), ("offset", JInt(U64)),
            ("max_bytes", JInt(U64, DEFAULT_FETCH_MAX_BYTES)), ("group_id", JStr("")))),
    Schema(OffsetCommit, 0x03, "OffsetCommit",
           (("group", Str), ("topic", Topic), ("partition", UInt32), ("offset", UInt64)),
           (("group", JStr()), ("topic", _J_TOPIC), ("partition", _J_PARTITION_NO), ("offset", JInt(U64)))),
    Schema(OffsetFetch, 0x04, "OffsetFetch",
           (("group", Str), ("topic", Topic), ("partition", UInt32)),
           (("group", JStr()), ("topic", _J_TOPIC), ("partition", _J_PARTITION_NO))),
    Schema(CreateTopic, 0x05, "CreateTopic",
           (("topic", Topic), ("partition_count", UInt32)),
           (("topic", _J_TOPIC), ("partition_count", JInt(U32)))),
    Schema(ListTopics, 0x06, "ListTopics"),
    Schema(DescribeTopic, 0x07, "DescribeTopic", (("topic", Topic),), (("topic", _J_TOPIC),)),
    Schema(DescribePartition, 0x08, "DescribePartition",
           (("topic", Topic), ("partition", UInt32)),
           (("topic", _J_TOPIC), ("partition", _J_PARTITION_NO))),
    Schema(MetricsFetch, 0x09, "MetricsFetch"),
    Schema(Ping, 0xFF, "Ping"),
)

# What a server sends; the client reads an Error as an ErrorReply (ERROR_REPLY below).
RESPONSES = (
    Schema(ProduceResponse, 0x01, "ProduceResponse",
           (("base_offset", UInt64), ("record_count", UInt32)),
           (("base_offset", JInt(U64)), ("record_count", JInt(U32)))),
    Schema(FetchResponse, 0x02, "FetchResponse",
           (("records", FetchedPayloads), ("next_offset", UInt64)),
           (("records", JFetchedRecords), ("next_offset", JInt(U64)))),
    Schema(OffsetCommitResponse, 0x03, "OffsetCommitResponse", (("success", Flag),), (("success", JBool()),)),
    Schema(OffsetFetchResponse, 0x04, "OffsetFetchResponse",
           (("offset", OptionalUInt64),), (("offset", JInt(U64, nullable=True)),)),
    Schema(CreateTopicResponse, 0x05, "CreateTopicResponse",
           (("success", Flag),), (("success", JBool()), ("partitions_created", JInt(U32, 0)))),
    Schema(ListTopicsResponse, 0x06, "ListTopicsResponse",
           (("topics", Array(BinaryStruct(TopicInfo, (("name", Str), ("partition_count", UInt32))))),),
           (("topics", JArray(JStruct(TopicInfo, (("name", JStr()), ("partition_count", JInt(U32)))))),)),
    Schema(DescribeTopicResponse, 0x07, "DescribeTopicResponse",
           (("topic", Str), (None, CountOf("partitions")), ("partitions", Array(_PARTITION))),
           (("topic", JStr()), ("partitions", JArray(_J_PARTITION)))),
    Schema(DescribePartitionResponse, 0x08, "DescribePartitionResponse",
           (("topic", Str), ("info", _PARTITION)),
           (("topic", JStr()), ("info", JInline(_J_PARTITION)))),
    Schema(MetricsResponse, 0x09, "MetricsFetchResponse",
           ((None, MetricsText(parse_prometheus)),), (("values", JOtherKeys),)),
    Schema(Pong, 0xFF, "Pong"),
    Schema(Error, 0xFE, "Error",
           (("kind", ErrorCode), ("message", Str)),
           (("kind", JErrorCode), ("message", JStr()), ("details", JAny(None)))),
)
ERROR_REPLY = Schema(ErrorReply, 0xFE, "Error",
                     (("code", UInt16), ("message", Str), ("details", Absent(None))),
                     (("code", JInt(U64)), ("message", JStr()), ("details", JAny(None))))


def _register(schemas: tuple[Schema, ...]) -> tuple[dict[int, Schema], dict[str, Schema]]:
    """Type byte -> schema and JSON type -> schema, after checking each schema against its class.

    Every name a layout lists must be a field of the class, and every field without a
    default must come from each layout (the dialect is set by the decoder).
    """
    by_code: dict[int, Schema] = {}
    by_name: dict[str, Schema] = {}
    for s in schemas:
        fields = {f.name: f for f in dataclasses.fields(s.cls)}
        required = {
            name for name, f in fields.items()
            if name != "dialect" and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        for dialect, names in (("binary", _binary_names(s)), ("JSON", [name for name, _ in s.json])):
            if not set(names) <= fields.keys() or not required <= set(names):
                raise TypeError(f"the {dialect} layout of {s.cls.__name__} lists {names}; its fields: {list(fields)}")
        if s.code in by_code or s.name in by_name:
            raise TypeError(f"{s.cls.__name__}: type 0x{s.code:02X} or {s.name!r} is used twice")
        by_code[s.code] = by_name[s.name] = s
    return by_code, by_name


def _binary_names(s: Schema) -> list[str]:
    names: list[str] = []
    for name, f in s.binary:
        names.extend(getattr(f, "provides", ()) if name is None else (name,))
    return names


_REQUEST_CODES, _REQUEST_NAMES = _register(REQUESTS)
_RESPONSE_CODES, _RESPONSE_NAMES = _register(RESPONSES)
_REPLY_CODES, _REPLY_NAMES = _register((ERROR_REPLY,))
_ENCODABLE = {s.cls: s for s in (*_REQUEST_CODES.values(), *_RESPONSE_CODES.values())}
_RESPONSE_CODES.update(_REPLY_CODES)
_RESPONSE_NAMES.update(_REPLY_NAMES)

# ---------------------------------------------------------------- the one codec


def encode(message: Request | Response, dialect: Dialect) -> bytes:
    """One payload (without its frame) in `dialect`, from the message's schema."""
    schema = _ENCODABLE.get(type(message))
    if schema is None:
        raise LocalProtocolError(f"not a RustLog request or response: {message!r}")
    if dialect is Dialect.JSON:
        obj: dict[str, Any] = {"type": schema.name}
        for key, jf in schema.json:
            jf.put(obj, key, getattr(message, key))
        return orjson.dumps(obj)
    out = [schema.tag]
    for name, bf in schema.binary:
        bf.write(message if name is None else getattr(message, name), out)
    return b"".join(out)


def _decode(payload: bytes, by_code: Mapping[int, Schema], by_name: Mapping[str, Schema], what: str) -> Any:
    """A message from the schema its type picks; raises InvalidField, MalformedJson or InvalidUtf8."""
    kwargs: dict[str, Any] = {}
    if payload[0] == BRACE:
        obj = parse_json(payload)
        kind = obj.get("type")
        schema = by_name.get(kind) if isinstance(kind, str) else None
        if schema is None:
            raise InvalidField(f"unknown {what} type {str(kind)[:80]!r}")
        for key, jf in schema.json:
            kwargs[key] = jf.get(obj, key)
        dialect = Dialect.JSON
    else:
        schema = by_code.get(payload[0])
        if schema is None:
            raise InvalidField(f"unknown {what} type 0x{payload[0]:02X}")
        r = Reader(payload)
        for name, bf in schema.binary:
            if name is None:
                kwargs.update(bf.read(r))
            else:
                kwargs[name] = bf.read(r)
        r.end()
        dialect = Dialect.BINARY
    if schema.with_dialect:
        kwargs["dialect"] = dialect
    return schema.cls(**kwargs)


def decode_request(payload: bytes) -> Request:
    """Server side: the request in one payload. An `InvalidField` is answered, not fatal."""
    return _decode(payload, _REQUEST_CODES, _REQUEST_NAMES, "request")


def decode_response(payload: bytes) -> Response | ErrorReply:
    """Client side: the response in one payload; a `MalformedResponse` when it cannot be read."""
    try:
        return _decode(payload, _RESPONSE_CODES, _RESPONSE_NAMES, "response")
    except InvalidField as e:
        raise MalformedResponse(f"bad response: {e}") from None


def parse_json(payload: bytes) -> dict[str, Any]:
    """The payload as a JSON object; fatal errors for bad UTF-8 or bad JSON."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as u:
            raise InvalidUtf8(f"payload is not UTF-8: {u.reason} at byte {u.start}") from None
        raise MalformedJson(f"payload is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise MalformedJson("payload must be a JSON object")
    return obj
