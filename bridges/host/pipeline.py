"""`Pipeline`: one connection's batches on their way to the device, and the answers they earn.

Every bridge forwards the same way, so the rules live here once and a protocol keeps only
what is its own: which acknowledgement a batch earns (its "plan", any value), and what a
refusal means on its wire.

- **Ordering.** Batches go to the device pipelined, and may be answered out of order (two
  devices, a resent request), but they settle strictly in the order they were launched:
  `accepted(plan)` is called for the oldest batch first, so no ack ever covers an event
  behind one the device has not accepted.
- **Affinity.** A connection's batches go to one device while it is up and answering,
  so a hung device stalls only the connections it is home to (docs/reliability.md).
- **Depth.** At most `depth` batches of a connection are at the device. `can_launch`
  also holds a batch back while the device link is full, since a batch that only waits
  for room keeps its mapped messages in memory for nothing; `slot()` waits for the depth.
- **Budgets.** What a session decodes it `take`s, in units of its choosing (Lumberjack
  counts events and windows, Courier events, the segment protocol bytes), against its own
  `max_pending` and, where the protocol has one, a process-wide `Budget`; the inflated
  bytes behind them are charged to the host's `--max-inflated-bytes` budget. A batch gives
  its units back when it settles, and the inflated bytes once every unit taken before them
  has settled. `room()` is where a session's reader waits.
- **DeviceRejected.** A refusal is counted and logged here; the protocol's `refused(plan,
  error)` decides the answer (Lumberjack and Courier close without acking, the segment
  protocol replies with an error). Nothing settles after a failure, so nothing after it is
  acknowledged. Any other error in a batch fails the pipeline the same way, unlogged.

`forward()` is the same refusal rule for a batch outside any connection (a store's
recovery, RustLog's one-request-at-a-time produce).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Awaitable, Callable, Generic, TypeVar

from bridges.host.budget import Budget
from bridges.host.mapping import Batches
from bridges.host.protocol import Host
from logjam.errors import DeviceRejected

log = logging.getLogger("logjam-bridge")

P = TypeVar("P")


class _Flight(Generic[P]):
    """A batch at the device: its plan, and the units and events it gives back when it settles."""

    __slots__ = ("task", "plan", "units", "events")

    def __init__(self, task: asyncio.Future[Any], plan: P, units: int, events: int) -> None:
        self.task = task
        self.plan = plan
        self.units = units
        self.events = events


def _done() -> asyncio.Future[None]:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


class Pipeline(Generic[P]):
    def __init__(
        self,
        host: Host,
        who: str,
        *,
        accepted: Callable[[P], None],
        refused: Callable[[P, BaseException], None],
        consequence: str,
        depth: int,
        max_pending: int | None = None,
        shared: Budget | None = None,
    ) -> None:
        self.link = host.link
        # This connection's batches go to one device while it answers (bridges/host/link.py).
        self.affinity = host.link.affinity()
        self.launched = False  # whether a batch went out yet (the first may move the affinity)
        self.metrics = host.metrics
        self.inflate = host.inflate
        self.who = who  # "<protocol> <peer>", for the log line of a refusal
        self.accepted = accepted
        self.refused = refused
        self.consequence = consequence  # what a refusal does, for the log line
        self.depth = max(1, depth)
        self.max_pending = max_pending
        self.shared = shared
        self.flights: deque[_Flight[P]] = deque()
        self.events_in_flight = 0
        self.pending = 0  # units taken and not yet settled
        self.taken = 0
        self.settled = 0
        # Inflated bytes charged to the host's budget: (units taken when charged, bytes).
        self._marks: deque[tuple[int, int]] = deque()
        self._inflated_held = 0
        self.failure: BaseException | None = None
        self._closed = False
        self._changed = asyncio.Event()  # a batch settled, or the pipeline failed

    def __len__(self) -> int:
        return len(self.flights)

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def oldest(self) -> P | None:
        """The plan of the oldest batch still at the device."""
        return self.flights[0].plan if self.flights else None

    # -- intake

    def take(self, units: int) -> None:
        """The session decoded `units` more; they count until a batch carrying them settles."""
        if units:
            self.pending += units
            self.taken += units
            if self.shared is not None:
                self.shared.take(units)

    def charge_inflated(self, n: int) -> None:
        """`n` inflated bytes behind the units taken so far: held until those units settle."""
        if n:
            self.inflate.take(n)
            self._inflated_held += n
            self._marks.append((self.taken, n))
            self._give_inflated()

    @property
    def has_room(self) -> bool:
        """Whether `room()` would return at once."""
        if self.shared is not None and self.shared.spent:
            return False
        if self.max_pending is not None and self.pending >= self.max_pending:
            return False
        return not self.inflate.spent

    async def room(self) -> None:
        """Return once this connection may decode more (at once when it may), or has failed."""
        while not self.failed:
            if self.shared is not None and self.shared.spent:
                await self.shared.given()  # any connection's ack may make room
            elif self.max_pending is not None and self.pending >= self.max_pending:
                await self._next_change()
            elif self.inflate.spent:
                await self.inflate.wait(give_up=lambda: self.failed)
            else:
                return

    # -- launch

    def can_launch(self, events: int) -> bool:
        """Whether a batch of `events` may go now: within the depth, and (unless none of ours
        is at the device) only while the device link can take it."""
        if self.failed or len(self.flights) >= self.depth:
            return False
        if not self.flights:
            return True
        # Our own batches may not be counted by the link yet; counting them twice errs on
        # the side of not pipelining when the device is already busy.
        return self.link.inflight + self.events_in_flight + events <= self.link.max_inflight

    async def slot(self) -> None:
        """Return once the depth allows another batch, or the pipeline failed."""
        while len(self.flights) >= self.depth and not self.failed:
            await self._next_change()

    def launch(self, plan: P, *, batches: Batches | None = None, work: Awaitable[None] | None = None,
               units: int = 0, events: int = 0, key: bytes | None = None) -> None:
        """Send `batches` to the device (or run `work`, a protocol's own step that publishes); `plan`
        settles after every batch launched before it. Neither: `plan` only keeps its place in line.
        `key` fingerprints the batch's first event for a client that resends on a new connection
        (bridges/host/homes.py): the connection's first batch goes where that event went before."""
        if work is None and batches is not None:
            if key is not None and not self.launched:
                self.link.rehome(self.affinity, key)
            work = self.link.publish(batches.batches, self.affinity, key)
        self.launched = True
        task = asyncio.ensure_future(work) if work is not None else _done()
        self.flights.append(_Flight(task, plan, units, events))
        self.events_in_flight += events
        task.add_done_callback(self._on_done)

    # -- settling

    def _on_done(self, _task: asyncio.Future[Any]) -> None:
        flights = self.flights
        while flights and flights[0].task.done() and not self.failed and not self._closed:
            flight = flights.popleft()
            self.events_in_flight -= flight.events
            try:
                flight.task.result()
            except DeviceRejected as e:
                self.metrics.device_rejected.inc(e.rejected)
                log.error("%s: %s; %s", self.who, e, self.consequence)
                self._fail(flight.plan, e)
                break
            except (Exception, asyncio.CancelledError) as e:
                self._fail(flight.plan, e)
                break
            self._settle(flight)
            self.accepted(flight.plan)
        self._changed.set()

    def _settle(self, flight: _Flight[P]) -> None:
        if flight.events:
            self.metrics.events_acked.inc(flight.events)
        units = flight.units
        if units:
            self.pending -= units
            self.settled += units
            if self.shared is not None:
                self.shared.give(units)
            if self._marks:
                self._give_inflated()

    def _give_inflated(self) -> None:
        marks = self._marks
        while marks and marks[0][0] <= self.settled:
            _, n = marks.popleft()
            self._inflated_held -= n
            self.inflate.give(n)

    def _fail(self, plan: P, error: BaseException) -> None:
        self.failure = error
        # Wake this session's reader wherever it waits, so the connection ends now.
        if self.shared is not None:
            self.shared.wake()
        self.inflate.wake()
        self.refused(plan, error)

    async def _next_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    # -- the end

    async def finish(self, *, through_failure: bool = False) -> None:
        """Return once every batch has settled, or the pipeline failed; with `through_failure`,
        once every batch has also finished after a failure (a store marks what the device took)."""
        while self.flights and not self.failed:
            await self._next_change()
        if through_failure and self.flights:
            await asyncio.gather(*(f.task for f in self.flights), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is still at the device and give back everything this connection holds."""
        self._closed = True
        self.affinity.release()
        tasks = [f.task for f in self.flights]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.flights.clear()
        self.events_in_flight = 0
        if self.shared is not None:
            self.shared.give(self.pending)
        self.pending = 0
        self.inflate.give(self._inflated_held)
        self._inflated_held = 0
        self._marks.clear()


async def forward(host: Host, batches: Batches, who: str) -> int:
    """Publish `batches` outside a connection's pipeline; returns how many the device refused
    (counted and logged, never retried: sending the same bytes again would be refused again)."""
    try:
        await host.link.publish(batches.batches)
        return 0
    except DeviceRejected as e:
        host.metrics.device_rejected.inc(e.rejected)
        log.error("%s: %s (check --app-env and --topic)", who, e)
        return e.rejected
