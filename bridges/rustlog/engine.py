"""Sans-IO RustLog engine: both dialects on one connection, server and client halves.

Framing is shared: a 4-byte big-endian length, then the payload. The length is
checked against the maximum before anything is buffered for the payload, and a
zero length ends the connection. The payload's first byte picks the dialect:
`{` is the JSON dialect of the RustLog protocol document, anything else is the binary
dialect the reference broker (kafka-lite) actually speaks (docs/protocols/rustlog.md).
Every request is answered in the dialect it came in.

Errors split the way the spec says. Malformed JSON, invalid UTF-8 in a JSON
payload and bad framing are fatal: `feed` raises a RemoteProtocolError and the
adapter sends `fatal_reply(err)` (one best-effort Error frame) and closes. An
unknown request type or bad fields are not fatal: `feed` yields a `BadRequest`
event and the adapter answers `Error(event.kind, event.message)`.

The requests and responses are in messages.py; codec.py holds the framing and one
declarative schema per message (field types in fields.py) with the one generic encoder
and decoder; prometheus.py renders MetricsFetch's binary answer. This module holds the two
halves, `RustlogServer` and `RustlogClient`.
"""

from __future__ import annotations

from collections import deque

from logjam.errors import FrameTooLarge, HeldErrors, LocalProtocolError, ProtocolError, RemoteProtocolError

from bridges.rustlog.codec import Framer, decode_request, decode_response, dialect_of, encode, frame
from bridges.rustlog.fields import InvalidField
from bridges.rustlog.messages import (
    DEFAULT_FETCH_MAX_BYTES, MAX_FRAME_SIZE, MAX_RECORD_SIZE, MAX_RECORDS_PER_BATCH, U16, U32, U64, BadRequest,
    CreateTopic, CreateTopicResponse, DescribePartition, DescribePartitionResponse, DescribeTopic,
    DescribeTopicResponse, Dialect, EmptyFrame, Error, ErrorKind, ErrorReply, Fetch, FetchedRecord, FetchResponse,
    InvalidUtf8, ListTopics, ListTopicsResponse, MalformedJson, MalformedResponse, MetricsFetch, MetricsResponse,
    OffsetCommit, OffsetCommitResponse, OffsetFetch, OffsetFetchResponse, PartitionInfo, Ping, Pong, Produce,
    ProduceResponse, Request, Response, TopicInfo,
)
from bridges.rustlog.prometheus import Metric, Summary, metric_values, render_prometheus

# `bridges.rustlog.engine` is the one name the adapters, tools and tests use: the vocabulary
# of messages.py and the metrics of prometheus.py are re-exported here.
__all__ = [
    "RustlogServer", "RustlogClient", "frame",
    "DEFAULT_FETCH_MAX_BYTES", "MAX_FRAME_SIZE", "MAX_RECORD_SIZE", "MAX_RECORDS_PER_BATCH", "U16", "U32", "U64",
    "Dialect", "ErrorKind", "EmptyFrame", "InvalidUtf8", "MalformedJson", "MalformedResponse",
    "Request", "Produce", "Fetch", "OffsetCommit", "OffsetFetch", "CreateTopic", "ListTopics", "DescribeTopic",
    "DescribePartition", "MetricsFetch", "Ping", "BadRequest",
    "Response", "ProduceResponse", "FetchedRecord", "FetchResponse", "OffsetCommitResponse", "OffsetFetchResponse",
    "CreateTopicResponse", "TopicInfo", "ListTopicsResponse", "PartitionInfo", "DescribeTopicResponse",
    "DescribePartitionResponse", "MetricsResponse", "Pong", "Error", "ErrorReply",
    "Metric", "Summary", "metric_values", "render_prometheus",
]

# ---------------------------------------------------------------- the two halves


class RustlogServer(HeldErrors):
    """The broker side: `feed` yields requests (or BadRequest); `send` answers the oldest one."""

    def __init__(self, max_frame: int = MAX_FRAME_SIZE) -> None:
        self._framer = Framer(max_frame)
        self._unanswered: deque[Dialect] = deque()
        self._last = Dialect.BINARY
        self._error: ProtocolError | None = None

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has arrived, not all of it (the host's --frame-timeout runs)."""
        return self._framer.buffered > 0

    def feed(self, data: bytes) -> list[Request | BadRequest]:
        """Requests in arrival order.

        A fatal error found after some good requests is held back and raised by the
        next call (`feed(b"")` once those requests are answered), so that a client's
        good requests are served before its bad frame closes the connection.
        """
        self._raise_held()
        events: list[Request | BadRequest] = []
        payloads, error = self._framer.feed(data)
        for payload in payloads:
            dialect = dialect_of(payload[0])
            self._last = dialect
            try:
                event: Request | BadRequest = decode_request(payload)
            except InvalidField as e:
                event = BadRequest(e.kind, str(e), dialect)
            except RemoteProtocolError as e:
                error = e
                break
            self._unanswered.append(dialect)
            events.append(event)
        return self._hold(events, error)

    @property
    def unanswered(self) -> int:
        return len(self._unanswered)

    def send(self, response: Response) -> bytes:
        """One framed answer to the oldest unanswered request, in that request's dialect."""
        if not self._unanswered:
            raise LocalProtocolError("no request is waiting for an answer")
        dialect = self._unanswered.popleft()
        return frame(encode(response, dialect))

    def fatal_reply(self, err: RemoteProtocolError) -> bytes:
        """A last Error frame before closing, in the best guess of the peer's dialect."""
        if isinstance(err, (MalformedJson, InvalidUtf8)):
            return frame(encode(Error(ErrorKind.INVALID_REQUEST, str(err)), Dialect.JSON))
        # An oversized frame shows its dialect in its first payload byte; an empty one has
        # none, so the connection's last dialect is the best guess.
        first = None if isinstance(err, EmptyFrame) else self._framer.peek_first_payload_byte()
        dialect = self._last if first is None else dialect_of(first)
        kind = ErrorKind.FRAME_TOO_LARGE if isinstance(err, FrameTooLarge) else ErrorKind.FRAME_ERROR
        return frame(encode(Error(kind, f"frame error: {err}"), dialect))


class RustlogClient:
    """The client side (tests, tools): `send(request)` in the request's dialect; `feed` yields responses."""

    def __init__(self, max_frame: int = MAX_FRAME_SIZE) -> None:
        self._framer = Framer(max_frame)

    def send(self, request: Request) -> bytes:
        return frame(encode(request, getattr(request, "dialect", Dialect.BINARY)))

    def feed(self, data: bytes) -> list[Response | ErrorReply]:
        payloads, error = self._framer.feed(data)
        if error is not None:
            raise error
        return [decode_response(payload) for payload in payloads]
