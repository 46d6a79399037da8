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

The requests and responses are in messages.py, the framing and both dialects' codecs in
codec.py; this module holds the two halves, `RustlogServer` and `RustlogClient`.
"""

from __future__ import annotations

from collections import deque

from logjam.errors import FrameTooLarge, HeldErrors, LocalProtocolError, ProtocolError, RemoteProtocolError

# The vocabulary and the codecs live in messages.py and codec.py; importing them here keeps
# `bridges.rustlog.engine` the one name the adapters, tools and tests use.
from bridges.rustlog.codec import *  # noqa: F403
from bridges.rustlog.codec import (  # noqa: F401
    _BRACE, _Bad, _decode_binary_request, _decode_binary_response, _decode_json_request, _decode_json_response,
    _encode_binary_request, _encode_binary_response, _encode_json_request, _encode_json_response, _Framer,
    _parse_json, _parse_prometheus,
)
from bridges.rustlog.messages import *  # noqa: F403

# ---------------------------------------------------------------- the two halves


class RustlogServer(HeldErrors):
    """The broker side: `feed` yields requests (or BadRequest); `send` answers the oldest one."""

    def __init__(self, max_frame: int = MAX_FRAME_SIZE) -> None:
        self._framer = _Framer(max_frame)
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
            dialect = Dialect.JSON if payload[0] == _BRACE else Dialect.BINARY
            self._last = dialect
            try:
                if dialect is Dialect.JSON:
                    event: Request | BadRequest = _decode_json_request(_parse_json(payload))
                else:
                    event = _decode_binary_request(payload)
            except _Bad as e:
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
        payload = _encode_json_response(response) if dialect is Dialect.JSON else _encode_binary_response(response)
        return frame(payload)

    def fatal_reply(self, err: RemoteProtocolError) -> bytes:
        """A last Error frame before closing, in the best guess of the peer's dialect."""
        if isinstance(err, (MalformedJson, InvalidUtf8)):
            return frame(_encode_json_response(Error(ErrorKind.INVALID_REQUEST, str(err))))
        # An oversized frame shows its dialect in its first payload byte; an empty one has
        # none, so the connection's last dialect is the best guess.
        first = None if isinstance(err, EmptyFrame) else self._framer.peek_first_payload_byte()
        dialect = self._last if first is None else (Dialect.JSON if first == _BRACE else Dialect.BINARY)
        kind = ErrorKind.FRAME_TOO_LARGE if isinstance(err, FrameTooLarge) else ErrorKind.FRAME_ERROR
        resp = Error(kind, f"frame error: {err}")
        return frame(_encode_json_response(resp) if dialect is Dialect.JSON else _encode_binary_response(resp))


class RustlogClient:
    """The client side (tests, tools): `send(request)` in the request's dialect; `feed` yields responses."""

    def __init__(self, max_frame: int = MAX_FRAME_SIZE) -> None:
        self._framer = _Framer(max_frame)

    def send(self, request: Request) -> bytes:
        if getattr(request, "dialect", None) is Dialect.JSON:
            return frame(_encode_json_request(request))
        return frame(_encode_binary_request(request))

    def feed(self, data: bytes) -> list[Response | ErrorReply]:
        out: list[Response | ErrorReply] = []
        payloads, error = self._framer.feed(data)
        if error is not None:
            raise error
        for payload in payloads:
            if payload[0] == _BRACE:
                obj = _parse_json(payload)
                out.append(_decode_json_response(obj))
            else:
                out.append(_decode_binary_response(payload))
        return out
