"""RustLog on the wire: framing, the JSON and binary dialects, and Prometheus text, as pure functions.

The engine halves (bridges/rustlog/engine.py) call these; nothing here keeps state but
the framer's buffer.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Iterable

import orjson

from logjam.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError

from bridges.rustlog.messages import *  # noqa: F403 (the vocabulary every codec speaks)
from bridges.rustlog.messages import _BRACE, _LEN, _TOPIC, _U16, _U32, _U64  # noqa: F401 (_BRACE: for the engine)

# ---------------------------------------------------------------- framing


class _Framer:
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
    return _LEN.pack(len(payload)) + payload


# ---------------------------------------------------------------- validation shared by both dialects


class _Bad(Exception):
    """Internal: a field is invalid; becomes a BadRequest event (never escapes feed)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.kind = kind


def _check_topic(topic: str) -> str:
    if not _TOPIC.match(topic):
        raise _Bad(f"invalid topic name {topic[:80]!r}: 1-255 characters from [A-Za-z0-9_-]")
    return topic


def _check_records(records: tuple[bytes, ...]) -> tuple[bytes, ...]:
    if len(records) > MAX_RECORDS_PER_BATCH:
        raise _Bad(f"{len(records)} records in one batch; at most {MAX_RECORDS_PER_BATCH}")
    for i, r in enumerate(records):
        if len(r) > MAX_RECORD_SIZE:
            raise _Bad(f"record {i} is {len(r)} bytes; at most {MAX_RECORD_SIZE}", ErrorKind.RECORD_TOO_LARGE)
    return records


# ---------------------------------------------------------------- JSON dialect


def _j_str(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise _Bad(f"field {key!r} must be a string")
    return value


def _j_int(obj: dict[str, Any], key: str, limit: int, default: int | None = None) -> int:
    value = obj.get(key, default)
    if type(value) is not int or not 0 <= value <= limit:
        raise _Bad(f"field {key!r} must be an integer in 0..{limit}")
    return value


def _j_records(obj: dict[str, Any]) -> tuple[bytes, ...]:
    value = obj.get("records")
    if not isinstance(value, list):
        raise _Bad("field 'records' must be an array of Base64 strings")
    if len(value) > MAX_RECORDS_PER_BATCH:
        raise _Bad(f"{len(value)} records in one batch; at most {MAX_RECORDS_PER_BATCH}")
    out = []
    b64 = base64.b64decode
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _Bad(f"record {i} must be a Base64 string")
        try:
            out.append(b64(item, validate=True))
        except (binascii.Error, ValueError):
            raise _Bad(f"record {i} is not valid Base64") from None
    return tuple(out)


def _decode_json_request(obj: dict[str, Any]) -> Request:
    kind = obj.get("type")
    d = Dialect.JSON
    if kind == "Produce":
        return Produce(_check_topic(_j_str(obj, "topic")), _j_int(obj, "partition", U32), _check_records(_j_records(obj)), d)
    if kind == "Fetch":
        return Fetch(
            _check_topic(_j_str(obj, "topic")), _j_int(obj, "partition", U32), _j_int(obj, "offset", U64),
            _j_int(obj, "max_bytes", U64, DEFAULT_FETCH_MAX_BYTES), _j_str(obj, "group_id", ""), d,
        )
    if kind == "OffsetCommit":
        return OffsetCommit(_j_str(obj, "group"), _check_topic(_j_str(obj, "topic")), _j_int(obj, "partition", U32), _j_int(obj, "offset", U64), d)
    if kind == "OffsetFetch":
        return OffsetFetch(_j_str(obj, "group"), _check_topic(_j_str(obj, "topic")), _j_int(obj, "partition", U32), d)
    if kind == "CreateTopic":
        return CreateTopic(_check_topic(_j_str(obj, "topic")), _j_int(obj, "partition_count", U32), d)
    if kind == "ListTopics":
        return ListTopics(d)
    if kind == "DescribeTopic":
        return DescribeTopic(_check_topic(_j_str(obj, "topic")), d)
    if kind == "DescribePartition":
        return DescribePartition(_check_topic(_j_str(obj, "topic")), _j_int(obj, "partition", U32), d)
    if kind == "MetricsFetch":
        return MetricsFetch(d)
    if kind == "Ping":
        return Ping(d)
    raise _Bad(f"unknown request type {str(kind)[:80]!r}")


def _parse_json(payload: bytes) -> dict[str, Any]:
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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _encode_json_response(resp: Response) -> bytes:
    if isinstance(resp, ProduceResponse):
        obj: dict[str, Any] = {"type": "ProduceResponse", "base_offset": resp.base_offset, "record_count": resp.record_count}
    elif isinstance(resp, FetchResponse):
        obj = {
            "type": "FetchResponse",
            "records": [
                {"offset": r.offset, "timestamp": r.timestamp, "payload": _b64(r.payload)} for r in resp.records
            ],
            "next_offset": resp.next_offset,
        }
    elif isinstance(resp, OffsetCommitResponse):
        obj = {"type": "OffsetCommitResponse", "success": resp.success}
    elif isinstance(resp, OffsetFetchResponse):
        obj = {"type": "OffsetFetchResponse", "offset": resp.offset}
    elif isinstance(resp, CreateTopicResponse):
        obj = {"type": "CreateTopicResponse", "success": resp.success, "partitions_created": resp.partitions_created}
    elif isinstance(resp, ListTopicsResponse):
        obj = {"type": "ListTopicsResponse", "topics": [{"name": t.name, "partition_count": t.partition_count} for t in resp.topics]}
    elif isinstance(resp, DescribeTopicResponse):
        obj = {"type": "DescribeTopicResponse", "topic": resp.topic, "partitions": [_j_partition(p) for p in resp.partitions]}
    elif isinstance(resp, DescribePartitionResponse):
        obj = {"type": "DescribePartitionResponse", "topic": resp.topic, **_j_partition(resp.info)}
    elif isinstance(resp, MetricsResponse):
        obj = {**resp.values, "type": "MetricsFetchResponse"}
    elif isinstance(resp, Pong):
        obj = {"type": "Pong"}
    elif isinstance(resp, Error):
        obj = {"type": "Error", "code": resp.kind.json_code, "message": resp.message, "details": resp.details}
    else:
        raise LocalProtocolError(f"not a RustLog response: {resp!r}")
    return orjson.dumps(obj)


def _j_partition(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.partition, "high_watermark": p.high_watermark,
        "log_start_offset": p.log_start_offset, "segment_count": p.segment_count,
    }


def _encode_json_request(req: Request) -> bytes:
    if isinstance(req, Produce):
        obj: dict[str, Any] = {"type": "Produce", "topic": req.topic, "partition": req.partition, "records": [_b64(r) for r in req.records]}
    elif isinstance(req, Fetch):
        obj = {"type": "Fetch", "group_id": req.group_id, "topic": req.topic, "partition": req.partition, "offset": req.offset, "max_bytes": req.max_bytes}
    elif isinstance(req, OffsetCommit):
        obj = {"type": "OffsetCommit", "group": req.group, "topic": req.topic, "partition": req.partition, "offset": req.offset}
    elif isinstance(req, OffsetFetch):
        obj = {"type": "OffsetFetch", "group": req.group, "topic": req.topic, "partition": req.partition}
    elif isinstance(req, CreateTopic):
        obj = {"type": "CreateTopic", "topic": req.topic, "partition_count": req.partition_count}
    elif isinstance(req, DescribeTopic):
        obj = {"type": "DescribeTopic", "topic": req.topic}
    elif isinstance(req, DescribePartition):
        obj = {"type": "DescribePartition", "topic": req.topic, "partition": req.partition}
    elif isinstance(req, (ListTopics, MetricsFetch, Ping)):
        obj = {"type": type(req).__name__}
    else:
        raise LocalProtocolError(f"not a RustLog request: {req!r}")
    return orjson.dumps(obj)


def _decode_json_response(obj: dict[str, Any]) -> Response | ErrorReply:
    kind = obj.get("type")
    try:
        if kind == "ProduceResponse":
            return ProduceResponse(obj["base_offset"], obj["record_count"])
        if kind == "FetchResponse":
            return FetchResponse(
                tuple(FetchedRecord(base64.b64decode(r["payload"], validate=True), r["offset"], r["timestamp"]) for r in obj["records"]),
                obj["next_offset"],
            )
        if kind == "OffsetCommitResponse":
            return OffsetCommitResponse(bool(obj["success"]))
        if kind == "OffsetFetchResponse":
            return OffsetFetchResponse(obj["offset"])
        if kind == "CreateTopicResponse":
            return CreateTopicResponse(bool(obj["success"]), obj.get("partitions_created", 0))
        if kind == "ListTopicsResponse":
            return ListTopicsResponse(tuple(TopicInfo(t["name"], t["partition_count"]) for t in obj["topics"]))
        if kind == "DescribeTopicResponse":
            return DescribeTopicResponse(obj["topic"], tuple(_j_partition_in(p) for p in obj["partitions"]))
        if kind == "DescribePartitionResponse":
            return DescribePartitionResponse(obj["topic"], _j_partition_in(obj))
        if kind == "MetricsFetchResponse":
            return MetricsResponse({k: v for k, v in obj.items() if k != "type"})
        if kind == "Pong":
            return Pong()
        if kind == "Error":
            return ErrorReply(obj["code"], obj["message"], obj.get("details"), Dialect.JSON)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise MalformedResponse(f"bad {kind} response: {e!r}") from None
    raise MalformedResponse(f"unknown response type {kind!r}")


def _j_partition_in(p: dict[str, Any]) -> PartitionInfo:
    return PartitionInfo(p["partition"], p["high_watermark"], p.get("log_start_offset"), p.get("segment_count"))


# ---------------------------------------------------------------- binary dialect

REQ_PRODUCE, REQ_FETCH, REQ_COMMIT, REQ_OFFSET_FETCH, REQ_CREATE = 0x01, 0x02, 0x03, 0x04, 0x05
REQ_LIST, REQ_DESCRIBE_TOPIC, REQ_DESCRIBE_PARTITION, REQ_METRICS, REQ_PING = 0x06, 0x07, 0x08, 0x09, 0xFF
RESP_ERROR, RESP_PONG = 0xFE, 0xFF


class _Reader:
    """Cursor over a binary payload; running past the end is a decode error (`_Bad`)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 1) -> None:
        self.data = data
        self.pos = pos

    def _take(self, n: int) -> int:
        start = self.pos
        if start + n > len(self.data):
            raise _Bad(f"truncated request: wanted {n} bytes at {start}, payload is {len(self.data)}")
        self.pos = start + n
        return start

    def u8(self) -> int:
        return self.data[self._take(1)]

    def u16(self) -> int:
        return _U16.unpack_from(self.data, self._take(2))[0]

    def u32(self) -> int:
        return _U32.unpack_from(self.data, self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.data, self._take(8))[0]

    def bytes_(self, n: int) -> bytes:
        start = self._take(n)
        return self.data[start:start + n]

    def str_(self) -> str:
        raw = self.bytes_(self.u16())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            # The reference answers decode error 2 here and keeps the connection.
            raise _Bad(f"string is not UTF-8: {e.reason}") from None

    def byte_list(self, max_items: int, max_item: int) -> tuple[bytes, ...]:
        count = self.u32()
        if count > max_items:
            raise _Bad(f"{count} records in one batch; at most {max_items}")
        data, out = self.data, []
        unpack = _U32.unpack_from
        pos, end = self.pos, len(data)
        for i in range(count):
            if pos + 4 > end:
                raise _Bad("truncated byte list")
            n = unpack(data, pos)[0]
            pos += 4
            if n > max_item:
                raise _Bad(f"record {i} is {n} bytes; at most {max_item}", ErrorKind.RECORD_TOO_LARGE)
            if pos + n > end:
                raise _Bad("truncated byte list")
            out.append(data[pos:pos + n])
            pos += n
        self.pos = pos
        return tuple(out)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Bad(f"{len(self.data) - self.pos} unexpected bytes after the request")


def _decode_binary_request(payload: bytes) -> Request:
    r = _Reader(payload)
    code = payload[0]
    d = Dialect.BINARY
    req: Request
    if code == REQ_PRODUCE:
        req = Produce(_check_topic(r.str_()), r.u32(), r.byte_list(MAX_RECORDS_PER_BATCH, MAX_RECORD_SIZE), d)
    elif code == REQ_FETCH:
        group, topic, partition, offset, max_bytes = r.str_(), r.str_(), r.u32(), r.u64(), r.u32()
        req = Fetch(_check_topic(topic), partition, offset, max_bytes, group, d)
    elif code == REQ_COMMIT:
        group, topic, partition, offset = r.str_(), r.str_(), r.u32(), r.u64()
        req = OffsetCommit(group, _check_topic(topic), partition, offset, d)
    elif code == REQ_OFFSET_FETCH:
        group, topic, partition = r.str_(), r.str_(), r.u32()
        req = OffsetFetch(group, _check_topic(topic), partition, d)
    elif code == REQ_CREATE:
        req = CreateTopic(_check_topic(r.str_()), r.u32(), d)
    elif code == REQ_LIST:
        req = ListTopics(d)
    elif code == REQ_DESCRIBE_TOPIC:
        req = DescribeTopic(_check_topic(r.str_()), d)
    elif code == REQ_DESCRIBE_PARTITION:
        req = DescribePartition(_check_topic(r.str_()), r.u32(), d)
    elif code == REQ_METRICS:
        req = MetricsFetch(d)
    elif code == REQ_PING:
        req = Ping(d)
    else:
        raise _Bad(f"unknown request type 0x{code:02X}")
    r.end()
    return req


def _w_str(s: str) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > U16:
        raw = raw[:U16]
    return _U16.pack(len(raw)) + raw


def _w_byte_list(items: Iterable[bytes]) -> bytes:
    items = list(items)
    parts = [_U32.pack(len(items))]
    for item in items:
        parts.append(_U32.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _encode_binary_response(resp: Response) -> bytes:
    if isinstance(resp, ProduceResponse):
        return b"\x01" + _U64.pack(resp.base_offset) + _U32.pack(resp.record_count)
    if isinstance(resp, FetchResponse):
        return b"\x02" + _w_byte_list(r.payload for r in resp.records) + _U64.pack(resp.next_offset)
    if isinstance(resp, OffsetCommitResponse):
        return b"\x03" + bytes([1 if resp.success else 0])
    if isinstance(resp, OffsetFetchResponse):
        return b"\x04\x00" if resp.offset is None else b"\x04\x01" + _U64.pack(resp.offset)
    if isinstance(resp, CreateTopicResponse):
        return b"\x05" + bytes([1 if resp.success else 0])
    if isinstance(resp, ListTopicsResponse):
        return b"\x06" + _U32.pack(len(resp.topics)) + b"".join(_w_str(t.name) + _U32.pack(t.partition_count) for t in resp.topics)
    if isinstance(resp, DescribeTopicResponse):
        n = len(resp.partitions)
        return (
            b"\x07" + _w_str(resp.topic) + _U32.pack(n) + _U32.pack(n)
            + b"".join(_U32.pack(p.partition) + _U64.pack(p.high_watermark) for p in resp.partitions)
        )
    if isinstance(resp, DescribePartitionResponse):
        return b"\x08" + _w_str(resp.topic) + _U32.pack(resp.info.partition) + _U64.pack(resp.info.high_watermark)
    if isinstance(resp, MetricsResponse):
        text = resp.text.encode("utf-8")
        return b"\x09" + _U32.pack(len(text)) + text
    if isinstance(resp, Pong):
        return b"\xff"
    if isinstance(resp, Error):
        return b"\xfe" + _U16.pack(resp.kind.binary_code) + _w_str(resp.message)
    raise LocalProtocolError(f"not a RustLog response: {resp!r}")


def _encode_binary_request(req: Request) -> bytes:
    if isinstance(req, Produce):
        return b"\x01" + _w_str(req.topic) + _U32.pack(req.partition) + _w_byte_list(req.records)
    if isinstance(req, Fetch):
        return b"\x02" + _w_str(req.group_id) + _w_str(req.topic) + _U32.pack(req.partition) + _U64.pack(req.offset) + _U32.pack(min(req.max_bytes, U32))
    if isinstance(req, OffsetCommit):
        return b"\x03" + _w_str(req.group) + _w_str(req.topic) + _U32.pack(req.partition) + _U64.pack(req.offset)
    if isinstance(req, OffsetFetch):
        return b"\x04" + _w_str(req.group) + _w_str(req.topic) + _U32.pack(req.partition)
    if isinstance(req, CreateTopic):
        return b"\x05" + _w_str(req.topic) + _U32.pack(req.partition_count)
    if isinstance(req, ListTopics):
        return b"\x06"
    if isinstance(req, DescribeTopic):
        return b"\x07" + _w_str(req.topic)
    if isinstance(req, DescribePartition):
        return b"\x08" + _w_str(req.topic) + _U32.pack(req.partition)
    if isinstance(req, MetricsFetch):
        return b"\x09"
    if isinstance(req, Ping):
        return b"\xff"
    raise LocalProtocolError(f"not a RustLog request: {req!r}")


def _decode_binary_response(payload: bytes) -> Response | ErrorReply:
    r = _Reader(payload)
    code = payload[0]
    try:
        if code == 0x01:
            resp: Response | ErrorReply = ProduceResponse(r.u64(), r.u32())
        elif code == 0x02:
            records = r.byte_list(U32, U32)
            resp = FetchResponse(tuple(FetchedRecord(p) for p in records), r.u64())
        elif code == 0x03:
            resp = OffsetCommitResponse(r.u8() == 1)
        elif code == 0x04:
            resp = OffsetFetchResponse(r.u64() if r.u8() == 1 else None)
        elif code == 0x05:
            resp = CreateTopicResponse(r.u8() == 1)
        elif code == 0x06:
            resp = ListTopicsResponse(tuple(TopicInfo(r.str_(), r.u32()) for _ in range(r.u32())))
        elif code == 0x07:
            topic, _count = r.str_(), r.u32()
            resp = DescribeTopicResponse(topic, tuple(PartitionInfo(r.u32(), r.u64()) for _ in range(r.u32())))
        elif code == 0x08:
            topic = r.str_()
            resp = DescribePartitionResponse(topic, PartitionInfo(r.u32(), r.u64()))
        elif code == 0x09:
            text = r.bytes_(r.u32()).decode("utf-8", "replace")
            resp = MetricsResponse(_parse_prometheus(text), text)
        elif code == RESP_PONG:
            resp = Pong()
        elif code == RESP_ERROR:
            resp = ErrorReply(r.u16(), r.str_(), None, Dialect.BINARY)
        else:
            raise MalformedResponse(f"unknown binary response type 0x{code:02X}")
        r.end()
    except _Bad as e:
        raise MalformedResponse(f"bad binary response 0x{code:02X}: {e}") from None
    return resp


# ---------------------------------------------------------------- Prometheus text


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: str  # "counter" or "gauge"
    help: str
    value: float


def render_prometheus(metrics: Iterable[Metric], prefix: str = "rustlog_") -> str:
    lines = []
    for m in metrics:
        name = prefix + m.name
        value = int(m.value) if float(m.value).is_integer() else m.value
        lines.append(f"# HELP {name} {m.help}\n# TYPE {name} {m.kind}\n{name} {value}\n")
    return "".join(lines)


def _parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out
