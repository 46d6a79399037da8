"""`Message`: the one type for a Logjam message, used by every part of the mesh."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import base64

import orjson

from logjam.compression import DEFAULT_MAX_DECOMPRESSED, compress, decompress
from logjam.errors import RemoteProtocolError
from logjam.meta import Compression, Meta, now_ms

HEARTBEAT = "heartbeat"


def ping_request(app_env: str = "logjam-ping", seq: int = 0) -> list[bytes]:
    """The frames of a ping request on a DEALER (empty delimiter first); a device answers
    ["ping", "200 OK", fqdn] (or a 400 when it cannot read it)."""
    return [b"", b"ping", app_env.encode(), b"{}", Meta.fresh(Compression.NONE, seq).pack()]


@dataclass(frozen=True, slots=True)
class Message:
    """`[app-env, topic, body, meta]`. `body` is the frame as sent, possibly compressed."""

    app_env: str
    topic: str
    body: bytes
    meta: Meta

    @classmethod
    def from_frames(cls, frames: Sequence[bytes]) -> "Message":
        """Decode the four data frames; raises a RemoteProtocolError subclass."""
        if len(frames) != 4:
            raise RemoteProtocolError(
                f"a Logjam data message has 4 frames, got {len(frames)}", reason="frame_count"
            )
        app_env, topic, body, meta = frames
        try:
            return cls(bytes(app_env).decode(), bytes(topic).decode(), bytes(body), Meta.unpack(meta))
        except UnicodeDecodeError as e:
            raise RemoteProtocolError(f"app-env or topic is not UTF-8: {e}", reason="bad_encoding") from None

    @classmethod
    def build(
        cls,
        app_env: str,
        topic: str,
        payload: bytes | dict[str, Any],
        *,
        compression: int = Compression.NONE,
        created_ms: int | None = None,
        seq: int = 0,
        device: int = 0,
    ) -> "Message":
        """Make a message from an uncompressed payload (bytes or a JSON-able dict)."""
        raw = payload if isinstance(payload, (bytes, bytearray)) else orjson.dumps(payload)
        meta = Meta(compression, device, now_ms() if created_ms is None else created_ms, seq)
        return cls(app_env, topic, compress(compression, bytes(raw)), meta)

    def to_frames(self) -> list[bytes]:
        return [self.app_env.encode(), self.topic.encode(), self.body, self.meta.pack()]

    @property
    def is_heartbeat(self) -> bool:
        return self.app_env == HEARTBEAT

    def payload(self, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
        """The body, decompressed."""
        return decompress(self.meta.compression, self.body, max_size)

    def json(self, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> Any:
        """The body, decompressed and parsed; raises RemoteProtocolError on bad JSON."""
        data = self.payload(max_size)
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise RemoteProtocolError(f"body is not JSON: {e}", reason="bad_json") from None


@dataclass(slots=True)
class MessageBatch:
    """Messages that share app-env, topic and compression, held as columns.

    This is how bridges hand events to a device: one `Message` and `Meta` object per
    event cost more than the rest of the forwarding, and the device link sends a whole
    column in one native call. `messages()` gives the same messages as `Message`s.
    Each body is the frame as sent (already compressed); the producer's meta carries
    device 0 and sequence 0, which the device replaces.
    """

    app_env: str
    topic: str
    compression: int = Compression.NONE
    bodies: list[bytes] = field(default_factory=list)
    created_ms: Sequence[int] = field(default_factory=list)
    # Or the bodies already joined, with their lengths (a bridge's mapper builds a run of
    # events this way): the link hands the blob to the wire as it is, so nothing is
    # sliced or copied per message on the way to the device.
    packed: tuple[bytes, Sequence[int]] | None = None

    def __len__(self) -> int:
        return len(self.packed[1]) if self.packed is not None else len(self.bodies)

    def append(self, body: bytes, created_ms: int) -> None:
        assert self.packed is None, "a packed batch is complete"
        self.bodies.append(body)
        self.created_ms.append(created_ms)  # type: ignore[attr-defined]

    def body_list(self) -> list[bytes]:
        if self.packed is None:
            return self.bodies
        blob, lens = self.packed
        out, pos = [], 0
        for size in lens:
            out.append(blob[pos : pos + size])
            pos += size
        return out

    def messages(self) -> list[Message]:
        return [
            Message(self.app_env, self.topic, body, Meta(self.compression, 0, created, 0))
            for body, created in zip(self.body_list(), self.created_ms)
        ]

    @classmethod
    def group(cls, messages: Iterable[Message]) -> list["MessageBatch"]:
        """Consecutive messages with the same app-env, topic and compression, as batches (order kept)."""
        out: list[MessageBatch] = []
        cur: MessageBatch | None = None
        for m in messages:
            if cur is None or (cur.app_env, cur.topic, cur.compression) != (m.app_env, m.topic, m.meta.compression):
                cur = cls(m.app_env, m.topic, m.meta.compression)
                out.append(cur)
            cur.append(m.body, m.meta.created_ms)
        return out


def body_from_bytes(data: bytes | memoryview, tags: Sequence[str] = ()) -> dict[str, Any]:
    """One event body from a client's bytes, the same in every bridge and tool.

    A JSON object stays itself; anything else becomes {"message": text} when it is UTF-8,
    else {"message_base64": ...}; `tags` (e.g. Courier's "_unmarshal_failure") are added
    to such a wrapper only.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = None
    if value.__class__ is dict:
        return value
    try:
        body: dict[str, Any] = {"message": bytes(data).decode("utf-8")}
    except UnicodeDecodeError:
        body = {"message_base64": base64.b64encode(data).decode("ascii")}
    if tags:
        body["tags"] = list(tags)
    return body
