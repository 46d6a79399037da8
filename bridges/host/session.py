"""`EngineSession`: one client connection driven through its protocol's sans-IO engine.

Every stream bridge reads the same way, so the loop lives here once, modelled on h11's
`next_event()`: read bytes, `feed` them, hand the events to the protocol, then `feed(b"")`
again until the engine returns nothing (its NEED_DATA), and only then read again. What the
session owns, so that no protocol writes it again:

- **The loop** (`read_loop`): an error the engine held back behind good events is raised
  by the `feed(b"")` after those events were handled (the engine contract,
  docs/architecture.md); the engine holds it (`logjam.errors.HeldErrors`), the session only
  keeps feeding. `feed_slice` feeds a large read in slices, checking the protocol's bounds
  (`before_feed`) before each (Lumberjack: a 64 KiB read of well-compressed input is
  thousands of events).
- **"A frame is half-read"**: the engine's `mid_frame`, passed to every `Connection.read`,
  so --frame-timeout bounds a frame the client began (slowloris) and --idle-timeout the
  wait between frames. An idle timeout while `waiting()` (the client waits for our acks)
  is not the client's fault: the session reads on.
- **The inflated-bytes charge** (`PipelineSession.take(units)`): decoded units count
  against the pipeline, and what the engine inflated since (`inflated_total`) against
  --max-inflated-bytes.
- **Failure**: a `PipelineSession`'s failure is its pipeline's; the default `refused` wakes
  the read that waits for the client, so the session ends now.

A protocol gives `on_events(events)` (what its events mean), its ack plan (`accepted`,
and `refused` where a refusal has a reply), and its own `run` around `read_loop` (what
happens to decoded events when reading ends). RustLog and OTLP/HTTP answer each request
before reading the next, so they use `EngineSession` without a pipeline.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from bridges.host.budget import Budget
from bridges.host.connection import Connection, IdleTimeout
from bridges.host.pipeline import Pipeline
from bridges.host.protocol import Host

P = TypeVar("P")


class EngineSession:
    """One connection: reads, and feeds its engine until it needs data. A protocol that
    answers each request before reading the next (RustLog) uses it as is; one that forwards
    pipelined batches uses `PipelineSession`."""

    read_size: ClassVar[int] = 65536
    # Feed at most this many bytes per `feed` call, with `before_feed` before each (None: a whole read).
    feed_slice: ClassVar[int | None] = None

    def __init__(self, host: Host, conn: Connection, engine: Any) -> None:
        self.host = host
        self.conn = conn
        # A server engine (docs/architecture.md, "The engine contract"): `feed(bytes)` -> list
        # of events ([] when it needs data), `mid_frame`, and `inflated_total` if it inflates.
        self.engine = engine
        self.unfed: bytes | memoryview = b""  # the rest of the last read, with `feed_slice`

    # -- what a protocol gives

    async def on_events(self, events: list[Any]) -> None:
        """Handle the events one `feed` returned, in order."""
        raise NotImplementedError

    def waiting(self) -> bool:
        """The client waits for our answers, so an idle timeout is not its fault."""
        return False

    def done(self) -> bool:
        """Read no more (the protocol closed the conversation)."""
        return False

    def on_eof(self) -> None:
        """The client closed its side (or the process stops reading it)."""

    async def before_feed(self) -> None:
        """Before each feed: wait for room, launch what is ready."""

    async def after_read(self) -> None:
        """Once a read was fed whole and the engine needs data: flush, drain."""
        await self.conn.drain()  # a client that does not read its answers is not read either

    # -- what the session does

    @property
    def failure(self) -> BaseException | None:
        """Why this session forwards no more (the pipeline failed); None while it may."""
        return None

    async def read(self) -> bytes:
        """The next bytes from the client; b"" at EOF or shutdown."""
        while True:
            try:
                return await self.conn.read(self.read_size, mid_frame=self.engine.mid_frame)
            except IdleTimeout:
                if self.waiting():
                    continue
                raise

    async def read_loop(self) -> None:
        """Read, feed, handle, feed again until the engine needs data; until EOF, `done()`
        or the pipeline's failure. A ProtocolError, a timeout or a lost connection propagates."""
        engine, step = self.engine, self.feed_slice
        while not self.done():
            await self.before_feed()
            if self.failure is not None:
                return
            pending = self.unfed
            if not pending:
                data = await self.read()
                if not data:
                    self.on_eof()
                    return
                pending = self.unfed = memoryview(data) if step else data
                # Other connections decoded while this one waited to read: check the bounds
                # again, so that together they overshoot by one slice, not one each.
                await self.before_feed()
                if self.failure is not None:
                    return
            if step:
                chunk, self.unfed = pending[:step], pending[step:]
            else:
                chunk, self.unfed = pending, b""
            events = engine.feed(chunk)
            while events:
                await self.on_events(events)
                if self.done():
                    break
                # The next portion, or an error the engine held behind the events just handled.
                events = engine.feed(b"")
            if not self.unfed:
                await self.after_read()


class PipelineSession(EngineSession, Generic[P]):
    """An `EngineSession` that forwards through a `Pipeline` whose plans (`P`) are the
    protocol's acks; the pipeline's failure is the session's."""

    def __init__(self, host: Host, conn: Connection, engine: Any, *, name: str, consequence: str,
                 depth: int, max_pending: int | None = None, shared: Budget | None = None) -> None:
        super().__init__(host, conn, engine)
        self.pipeline: Pipeline[P] = Pipeline(
            host, f"{name} {conn.peer}", accepted=self.accepted, refused=self.refused,
            consequence=consequence, depth=depth, max_pending=max_pending, shared=shared,
        )
        self._inflated_seen = 0

    def accepted(self, plan: P) -> None:
        """The device accepted the batch `plan` was launched with (and everything before it)."""

    def refused(self, plan: P, error: BaseException) -> None:
        """The pipeline failed at `plan` (the device refused it, or its work failed)."""
        self.conn.stop_reading()  # ends a read that waits for the client

    @property
    def failure(self) -> BaseException | None:
        return self.pipeline.failure

    def take(self, units: int) -> None:
        """`units` more decoded: they count against the bounds until their batch settles, and
        the bytes the engine inflated for them against --max-inflated-bytes."""
        pipeline = self.pipeline
        pipeline.take(units)
        inflated = getattr(self.engine, "inflated_total", 0)
        if inflated != self._inflated_seen:
            pipeline.charge_inflated(inflated - self._inflated_seen)
            self._inflated_seen = inflated
