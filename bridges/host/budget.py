"""`Budget`: a process-wide bound on what all connections together hold before it is acknowledged.

Two budgets exist. `--max-inflated-bytes`: a compressed frame is bounded on its own
(--max-decompressed-size and friends), but a few connections each holding a frame's worth
of inflated events multiply that bound, so sessions charge what their engine inflated
from the moment it is decoded until the client's events are acknowledged. And Lumberjack's
`--max-process-pending-events`: events decoded and not yet acknowledged. A session waits
before decoding more while a budget is spent; nobody fails for want of it. A charge may
overshoot (a frame is charged after it inflated), so the bound is the budget plus one
frame, never a frame per connection.

`bridges/host/pipeline.py` takes and gives; sessions only wait.
"""

from __future__ import annotations

import asyncio
from typing import Callable


class Budget:
    def __init__(self, limit: int, *, gauge: Callable[[int], None] | None = None,
                 on_wait: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self._gauge = gauge  # told every new value (a metric)
        self._on_wait = on_wait  # told whenever a caller has to wait (a metric)
        self._given = asyncio.Event()

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def take(self, n: int) -> None:
        if n:
            self.used += n
            if self._gauge is not None:
                self._gauge(self.used)

    def give(self, n: int) -> None:
        if n:
            self.used -= n
            if self._gauge is not None:
                self._gauge(self.used)
            self._given.set()

    def wake(self) -> None:
        """Wake every waiter to re-check its own conditions (a session that failed)."""
        self._given.set()

    async def given(self) -> None:
        """Return at the next give (or wake), whoever gave: callers re-check their own bounds too."""
        self._given.clear()
        await self._given.wait()

    async def wait(self, give_up: Callable[[], bool] | None = None) -> None:
        """Return once the budget has room (at once when it has), or once `give_up()` says so."""
        if not self.spent:
            return
        if self._on_wait is not None:
            self._on_wait()
        while self.spent and not (give_up is not None and give_up()):
            await self.given()
