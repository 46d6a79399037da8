"""`Keepalive`: the timer that tells a waiting client the bridge is still there.

While a client's events wait on the device (slow, paused, holding for importers), the
bridge writes nothing, and clients give up after a while of silence (Courier after 15 s,
Beats after its own timeout, Pravega writers). Each protocol has its own bytes for "still
working" (Lumberjack repeats an ack, Courier sends a partial ACKN, the segment protocol a
KeepAlive); the timing is the same for all, so it lives here once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from bridges.host.connection import Connection

# The shortest sleep between checks: a keepalive is never urgent to the millisecond.
MIN_SLEEP_S = 0.05


class KeepaliveTimer:
    """Every `interval` seconds since the last answer, write what `due()` returns (if anything).

    A session calls `answered()` when it writes a real answer, which restarts the clock; a
    session that never calls it gets `due()` every `interval`. When `due()` returns None
    (nothing waits, or the client asked for silence) the clock restarts too.
    """

    def __init__(self, conn: Connection, interval: float, due: Callable[[], bytes | None]) -> None:
        self.conn = conn
        self.interval = interval
        self.due = due
        self.last = time.monotonic()

    def answered(self) -> None:
        self.last = time.monotonic()

    async def run(self) -> None:
        interval = self.interval
        while True:
            await asyncio.sleep(max(MIN_SLEEP_S, interval - (time.monotonic() - self.last)))
            if time.monotonic() - self.last < interval:
                continue
            self.last = time.monotonic()
            data = self.due()
            if data:
                self.conn.write(data)

    def start(self, name: str) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name=name)
