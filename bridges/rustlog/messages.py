"""RustLog's vocabulary: limits, dialects, error kinds, and every request and response as a frozen dataclass.

Shared by the engine halves (bridges/rustlog/engine.py) and the codec (bridges/rustlog/codec.py,
whose schemas build and read these classes with the field types of fields.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from logjam.errors import RemoteProtocolError

MAX_FRAME_SIZE = 10 * 1024 * 1024
MAX_RECORD_SIZE = 10 * 1024 * 1024
MAX_RECORDS_PER_BATCH = 1000
DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1


class Dialect(enum.Enum):
    JSON = "json"
    BINARY = "binary"


class ErrorKind(enum.Enum):
    """A failure and its code in each dialect: (JSON code of the spec, binary code of the reference)."""

    INVALID_REQUEST = (400, 2)
    TOPIC_NOT_FOUND = (404, 10)
    PARTITION_NOT_FOUND = (405, 10)
    RECORD_TOO_LARGE = (413, 2)
    OFFSET_OUT_OF_RANGE = (416, 4)
    TOPIC_EXISTS = (400, 11)
    BAD_PARTITION_COUNT = (400, 12)
    DESCRIBE_TOPIC_NOT_FOUND = (404, 13)
    DESCRIBE_PARTITION_NOT_FOUND = (405, 14)
    FETCH_FAILED = (503, 4)
    COMMIT_FAILED = (503, 5)
    FRAME_ERROR = (400, 1)
    FRAME_TOO_LARGE = (413, 1)
    INTERNAL = (500, 500)
    STORAGE = (503, 500)
    INSUFFICIENT_SPACE = (507, 500)

    @property
    def json_code(self) -> int:
        return self.value[0]

    @property
    def binary_code(self) -> int:
        return self.value[1]

    def code(self, dialect: Dialect) -> int:
        return self.value[0] if dialect is Dialect.JSON else self.value[1]


# ---------------------------------------------------------------- fatal errors


class EmptyFrame(RemoteProtocolError):
    reason = "empty_frame"


class MalformedJson(RemoteProtocolError):
    reason = "bad_json"


class InvalidUtf8(RemoteProtocolError):
    reason = "bad_utf8"


class MalformedResponse(RemoteProtocolError):
    """Client side: the server's answer cannot be decoded."""

    reason = "bad_response"


# ---------------------------------------------------------------- requests (server events, client input)


@dataclass(frozen=True, slots=True)
class Produce:
    topic: str
    partition: int
    records: tuple[bytes, ...]
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class Fetch:
    topic: str
    partition: int
    offset: int
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    group_id: str = ""
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    group: str
    topic: str
    partition: int
    offset: int
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class OffsetFetch:
    group: str
    topic: str
    partition: int
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class CreateTopic:
    topic: str
    partition_count: int
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class ListTopics:
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class DescribeTopic:
    topic: str
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class DescribePartition:
    topic: str
    partition: int
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class MetricsFetch:
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class Ping:
    dialect: Dialect = Dialect.JSON


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A well-framed request that cannot be served; answer `Error(kind, message)` and keep going."""

    kind: ErrorKind
    message: str
    dialect: Dialect


Request = (
    Produce | Fetch | OffsetCommit | OffsetFetch | CreateTopic | ListTopics
    | DescribeTopic | DescribePartition | MetricsFetch | Ping
)

# ---------------------------------------------------------------- responses (server input, client events)


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    base_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    payload: bytes
    offset: int | None = None  # the binary dialect carries neither offset nor timestamp
    timestamp: int | None = None  # microseconds since the epoch


@dataclass(frozen=True, slots=True)
class FetchResponse:
    records: tuple[FetchedRecord, ...]
    next_offset: int


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    success: bool


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    offset: int | None


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    success: bool
    partitions_created: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partition_count: int


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    topics: tuple[TopicInfo, ...]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    high_watermark: int
    log_start_offset: int | None = None  # not in the binary dialect
    segment_count: int | None = None


@dataclass(frozen=True, slots=True)
class DescribeTopicResponse:
    topic: str
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class DescribePartitionResponse:
    topic: str
    info: PartitionInfo


@dataclass(frozen=True, slots=True)
class MetricsResponse:
    """`values` is the JSON dialect's answer, `text` (Prometheus exposition) the binary one."""

    values: Mapping[str, Any] = field(default_factory=dict)
    text: str = ""


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Error:
    """Server side: an error, coded per dialect when sent."""

    kind: ErrorKind
    message: str
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Client side: an Error frame as received."""

    code: int
    message: str
    details: Mapping[str, Any] | None
    dialect: Dialect


Response = (
    ProduceResponse | FetchResponse | OffsetCommitResponse | OffsetFetchResponse
    | CreateTopicResponse | ListTopicsResponse | DescribeTopicResponse
    | DescribePartitionResponse | MetricsResponse | Pong | Error
)
