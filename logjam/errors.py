"""The one error family raised by every protocol engine and codec in logjam-mesh.

`RemoteProtocolError` means the peer sent something invalid: answer as the protocol
says, count it, and keep serving others. `LocalProtocolError` means our own code
asked an engine to do something the protocol forbids: that is a bug on our side.
`CorruptStore` means bytes we wrote ourselves (a journal, a store) fail their check:
neither side of a connection is to blame.
Each error carries a short machine-readable `reason` used as a metrics label.
"""

from __future__ import annotations

from typing import Iterable, TypeVar

T = TypeVar("T")


class ProtocolError(Exception):
    """Base of every protocol or codec error."""

    reason: str = "protocol_error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol."""

    reason = "remote_protocol_error"


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""

    reason = "local_protocol_error"


class CorruptStore(ProtocolError):
    """Data this process wrote earlier does not read back (a checksum or framing fails)."""

    reason = "corrupt_store"


class DeviceRejected(RemoteProtocolError):
    """The device answered "400 Bad Request" for some of the messages a client's events became."""

    reason = "device_rejected"

    def __init__(self, rejected: int, total: int) -> None:
        super().__init__(f"device rejected {rejected} of {total} messages")
        self.rejected = rejected
        self.total = total


class FrameTooLarge(RemoteProtocolError):
    """A length field claims more than the configured maximum; nothing was allocated."""

    reason = "frame_too_large"


class MetaError(RemoteProtocolError):
    """The 24-byte Logjam meta frame is malformed."""

    reason = "broken_meta"


class CompressionError(RemoteProtocolError):
    """A body could not be decompressed."""

    reason = "decompression_failed"


class DecompressedTooLarge(CompressionError):
    """A body would decompress to more than the configured bound."""

    reason = "decompressed_too_large"


class InvalidAppEnv(RemoteProtocolError):
    """A stream name (app-env) breaks the naming rules."""

    reason = "bad_app_env"


class InvalidTopic(RemoteProtocolError):
    """A topic does not start with a known prefix."""

    reason = "bad_topic"


def until_error(events: Iterable[T]) -> tuple[list[T], ProtocolError | None]:
    """Every event up to the first ProtocolError, and that error: the engine contract's rule.

    Every protocol engine's `feed(data)` returns a list of the events `data` completes.
    A violation is raised as a ProtocolError by the call that meets it when no event came
    before it in that call; otherwise the events before it are returned and the error is
    raised by the next call (`feed(b"")` once they are handled), so that what a client sent
    correctly is still answered before its connection is closed. Once raised, every later
    call raises it again. (Lumberjack raises at once: its compressed frame is all or
    nothing, so that no event of a refused frame is published; nothing of that read is
    acknowledged, and the client sends it again.)
    """
    out: list[T] = []
    try:
        for event in events:
            out.append(event)
    except ProtocolError as e:
        e.__traceback__ = None  # it may hold frames that held large buffers
        return out, e
    return out, None


class HeldErrors:
    """Mixin for every server engine: the `until_error` rule, with the error held in
    `self._error` (which the engine sets to None in __init__). `feed` begins with
    `_raise_held()` and ends with `_hold(events, error)`, or `_until_error(generator)`."""

    __slots__ = ()
    _error: ProtocolError | None

    def _raise_held(self) -> None:
        """First thing in `feed`: a connection that broke the protocol stays broken."""
        if self._error is not None:
            raise self._error

    def _hold(self, events: list[T], error: ProtocolError | None) -> list[T]:
        """The events, or the error when none came before it (else it is held for the next call)."""
        if error is not None:
            error.__traceback__ = None  # it may hold frames that held large buffers
            self._error = error
            if not events:
                raise error
        return events

    def _until_error(self, events: Iterable[T]) -> list[T]:
        """`_hold` for the events of a generator, up to its first ProtocolError."""
        return self._hold(*until_error(events))
