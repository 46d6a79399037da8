"""Fair admission: while importers fall behind, a loud stream waits at the device and small ones go on.

Without it, when the importers lag (a flood), the device stops reading its inputs for every
stream alike (devices/lag.py), and every stream's messages queue behind the flood: measured
(issue 35, benchmarks/fairness.py), a 50 ev/s stream was 10-12 s stale while one app-env
flooded, because the importer's group commit made each Spark job ~5 s long (everything that
arrived during the last one) and a quiet event waited for one job and rode the next.

So from `max_importer_lag × FAIR_FRACTION` seconds of importer lag on (5 s by default, half
the hard limit), the device reads on but *parks* the messages of the app-envs taking more
than their share of what it received in the last WINDOW seconds: they are neither journaled,
published nor answered, so back-pressure reaches only the connections that sent them
(a bridge's in-flight bound, a producer's pending requests), while every other stream is
published at once. The parked messages are committed, in arrival order and ahead of anything
read after them, and answered, when the lag is back under the threshold or when the oldest
has waited MAX_PARK seconds, whichever comes first, as long as the importers are under the
hard limit (--max-importer-lag). Past it, where the device used to leave every input unread,
the loud streams stay parked until the importers are back under it, and the others are
still served. Parking bounds how much of the loud stream is between the device and Spark (so
each importer commit stays short), not how much the loud stream lands.

A device answers one connection in order (replies carry no id), so a reply to a message
published at once, from a connection that has a parked message before it, is parked too: its
event is published (fresh), only its acknowledgement waits. Pings are answered at once.
MAX_PARK keeps a loud sender's acknowledgement well within a bridge's --device-deadline
(5 s) under the hard limit, so a parking device is not taken for a hung one. At most MAX_PARKED messages
are parked; beyond that the device stops reading, as it does at the hard limit.
Nothing acknowledged is at risk: a parked message was never acknowledged, and a device
stopped while parking commits them first (Device._final_drain); killed, their senders resend.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from logjam.constants import ACCEPTED
from devices.batch import TupleBatch
from devices.counters import Counters

log = logging.getLogger("logjam-device")

FAIR_FRACTION = 0.5  # of --max-importer-lag: the importer lag from which loud streams are parked
WINDOW = 5  # seconds of per-app-env arrivals that decide who is loud
MAX_PARKED = 50_000  # messages; the in-flight bound of 2.5 bridge processes, far below the PUB high-water mark
# Seconds a message stays parked at most (under the hard limit): then it is committed and
# answered even though the importers are still behind. A sender (a Lumberjack connection
# waits for its window's ack) never waits much longer than this, and the loud stream keeps
# a rate of (what its senders keep in flight) / MAX_PARK.
MAX_PARK = 1.5
PING = b"ping"

Reply = tuple[bytes, bytes, bytes | None]


class Fairness:
    """Which streams are loud, and the messages and replies parked while the importers are behind."""

    def __init__(self, counters: Counters, max_lag: float) -> None:
        self.counters = counters
        self.threshold = max_lag * FAIR_FRACTION  # 0: off (no flow control at all)
        self.heavy: frozenset[bytes] = frozenset()
        self.parked = TupleBatch()
        self.replies: list[Reply] = []
        self._rids: set[bytes] = set()  # connections with a parked reply
        self._last_parked = False
        self._last: dict[bytes, int] = {}
        self._window: deque[dict[bytes, int]] = deque(maxlen=WINDOW)
        self.parked_total = 0  # messages parked since start
        self.parked_seconds = 0.0
        self.longest = 0.0  # the longest a parked message waited (a loud sender's acknowledgement too)
        self._since: float | None = None
        self._next_log = 0.0

    def tick(self) -> None:
        """Once a second: the loud streams are those above an equal share of the window's arrivals."""
        now = dict(self.counters.per_app_env)
        last = self._last
        self._window.append({app: n - last.get(app, 0) for app, n in now.items() if n != last.get(app, 0)})
        self._last = now
        totals: dict[bytes, int] = {}
        for second in self._window:
            for app, n in second.items():
                totals[app] = totals.get(app, 0) + n
        if len(totals) < 2:
            self.heavy = frozenset()
            return
        share = sum(totals.values()) / len(totals)
        self.heavy = frozenset(app for app, n in totals.items() if n > share)

    def pressing(self, importer_lag: float) -> bool:
        """Park now: the importers are past the threshold and some stream takes more than its share."""
        return 0 < self.threshold < importer_lag and bool(self.heavy)

    def full(self) -> bool:
        return len(self.parked) >= MAX_PARKED

    def overdue(self, now: float) -> bool:
        """The oldest parked message has waited MAX_PARK seconds: commit what is parked."""
        return self._since is not None and now - self._since >= MAX_PARK

    def adder(self, batch: TupleBatch) -> Callable[[tuple], None]:
        """`append` for the drain: a loud stream's message is parked, any other goes into `batch`."""
        admit, park, heavy = batch.append, self.parked.append, self.heavy

        def add(entry: tuple) -> None:
            if entry[0] in heavy:
                park(entry)
                self._last_parked = True
            else:
                admit(entry)
                self._last_parked = False
        return add

    def answerer(self, replies: list[Reply]) -> Callable[[Reply], None]:
        """`append` for the drain's replies: parked when its message was, or behind a parked reply."""
        now, later, rids = replies.append, self.replies.append, self._rids

        def answer(reply: Reply) -> None:
            rid, first, status = reply
            # A 202 directly follows the add() of its own message (Intake.drain_python, devices/intake.py).
            if first != PING and (rid in rids or (status == ACCEPTED and self._last_parked)):
                rids.add(rid)
                later(reply)
            else:
                now(reply)
        return answer

    def parking(self, parked_before: int) -> None:
        """After a drain: count what it parked, and note when parking started."""
        if len(self.parked) > parked_before:
            self.parked_total += len(self.parked) - parked_before
            if self._since is None:
                self._since = now = time.monotonic()
                if now >= self._next_log:  # an episode parks every MAX_PARK seconds: say so once a minute
                    self._next_log = now + 60.0
                    log.info("importers behind by more than %.1fs: parking %s (up to %.1fs each), other streams go on",
                             self.threshold, b", ".join(sorted(self.heavy)).decode("ascii", "replace"), MAX_PARK)

    def release(self) -> tuple[TupleBatch, list[Reply]]:
        """Everything parked (messages, then the replies in order); parking starts afresh."""
        batch, replies = self.parked, self.replies
        self.parked, self.replies = TupleBatch(), []
        self._rids.clear()
        self._last_parked = False
        if self._since is not None:
            waited = time.monotonic() - self._since
            self.parked_seconds += waited
            self.longest = max(self.longest, waited)
            self._since = None
        return batch, replies

    def snapshot(self) -> dict[str, object]:
        since = self._since
        return {"parked": len(self.parked), "parked_total": self.parked_total,
                "parked_seconds": self.parked_seconds + (time.monotonic() - since if since is not None else 0.0),
                "longest": self.longest, "loud": sorted(a.decode("ascii", "replace") for a in self.heavy)}
