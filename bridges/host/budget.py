"""`InflateBudget`: decompressed bytes in flight, process-wide (--max-inflated-bytes).

A compressed frame is bounded on its own (--max-decompressed-size and friends), but a few
connections each holding a frame's worth of inflated events multiply that bound. Sessions
charge what their engine inflated from the moment it is decoded until the client's events
are acknowledged, and wait before decoding more while the budget is spent; nobody fails
for want of it. One frame may overshoot the budget (it is charged after it inflated), so
the bound is the budget plus one frame, never a frame per connection.
"""

from __future__ import annotations

import asyncio

from bridges.host.metrics import BridgeMetrics


class InflateBudget:
    def __init__(self, limit: int, metrics: BridgeMetrics | None = None) -> None:
        self.limit = limit
        self.used = 0
        self._metrics = metrics
        self._room = asyncio.Event()

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def take(self, n: int) -> None:
        if n:
            self.used += n
            if self._metrics is not None:
                self._metrics.inflated_bytes.set(self.used)

    def give(self, n: int) -> None:
        if n:
            self.used -= n
            if self._metrics is not None:
                self._metrics.inflated_bytes.set(self.used)
            if self.used < self.limit:
                self._room.set()

    async def wait(self) -> None:
        """Return once the budget has room (at once when it has)."""
        if not self.spent:
            return
        if self._metrics is not None:
            self._metrics.inflate_waits.inc()
        while self.spent:
            self._room.clear()
            await self._room.wait()
