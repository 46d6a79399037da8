"""Flow control from the importers back to the shippers: the device admits no more than they can land.

PUB/SUB has no back-pressure, and a device journals and publishes far faster than Spark
lands rows (measured: bridges acknowledged ~100k events/s while ~6k/s landed), so
without this a burst becomes minutes of staleness, and an importer behind its SUB
high-water mark has to fetch everything through replay. Importers report, over the
replay endpoint, the position everything up to which is committed to the table (or filtered
out). The device remembers when it published which seq, and while an *in-sync* importer
is more than `--max-importer-lag` seconds (or `--max-importer-lag-messages` messages)
behind, it reads nothing from its inputs:
bridges and clients then see a slow device, and their own back-pressure holds shippers.
An acknowledgement still means "journaled and published"; only its timing changes.

In sync is like Kafka's ISR: an importer that reported recently and is not far behind.
One that starts far behind (a restart catching up through replay) does not hold ingest
until it has caught up to half the limit; one that stays over the limit for `evict_after`
seconds (a stalled Spark) is dropped from the set and logged, so a broken importer can
delay ingest but never stop it.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass

log = logging.getLogger("logjam-device")

STALE_AFTER = 5.0  # no report for this long (they come twice a second): the importer stopped or paused
SAMPLE_EVERY = 0.05  # seconds between (seq, time) samples
MAX_SAMPLES = 100_000  # ~80 minutes of them; an importer further behind is far over any limit anyway


@dataclass(slots=True)
class _Importer:
    seq: int
    reported: float
    in_sync: bool = False
    over_since: float | None = None


class ImporterLag:
    """Per importer: its committed seq; and how long the oldest seq it has not committed has waited."""

    def __init__(self, journal_id: str, max_lag: float, evict_after: float = 60.0, max_messages: int = 0) -> None:
        self.journal_id = journal_id
        self.max_lag = max_lag
        # Seconds alone are not enough: at 100k+ messages/s ten seconds outgrow the PUB
        # high-water mark, and then messages are dropped and must come back through replay.
        self.max_messages = max_messages
        self.evict_after = evict_after
        self._importers: dict[str, _Importer] = {}
        self._lock = threading.Lock()  # progress arrives on the replay thread
        # (last seq published, when), both increasing: when each seq was published, to SAMPLE_EVERY.
        self._seqs: list[int] = []
        self._times: list[float] = []
        self.holding = False
        self.worst = 0.0  # the largest lag of an in-sync importer at the last admit() (devices/fair.py)
        self.held_seconds = 0.0
        self._held_from: float | None = None

    def published(self, last_seq: int, now: float) -> None:
        if self._times and now - self._times[-1] < SAMPLE_EVERY:
            self._seqs[-1] = last_seq
            return
        self._seqs.append(last_seq)
        self._times.append(now)
        if len(self._seqs) > MAX_SAMPLES:
            del self._seqs[: MAX_SAMPLES // 10], self._times[: MAX_SAMPLES // 10]

    def progress(self, name: str, journal: str, seq: int, now: float) -> None:
        """An importer's report: everything of `journal` up to `seq` is committed (replay thread)."""
        if journal != self.journal_id:
            return
        with self._lock:
            imp = self._importers.get(name)
            if imp is None:
                self._importers[name] = _Importer(seq, now)
                log.info("importer %s reports progress (seq %d)", name, seq)
            else:
                imp.seq, imp.reported = max(imp.seq, seq), now

    def lag_of(self, seq: int, now: float) -> float:
        """Seconds since the device published seq + 1 (0 when nothing after `seq` was published)."""
        i = bisect.bisect_right(self._seqs, seq)
        return now - self._times[i] if i < len(self._times) else 0.0

    def lags(self, now: float) -> dict[str, float]:
        with self._lock:
            return {name: self.lag_of(imp.seq, now) for name, imp in self._importers.items()
                    if now - imp.reported < STALE_AFTER}

    def admit(self, now: float) -> bool:
        """False while an in-sync importer is more than `max_lag` behind."""
        if self.max_lag <= 0:
            return True
        hold = False
        with self._lock:
            for name in [n for n, imp in self._importers.items() if now - imp.reported >= STALE_AFTER]:
                log.info("importer %s stopped reporting; not waiting for it", name)
                del self._importers[name]
            oldest = min((imp.seq for imp in self._importers.values()), default=None)
            worst = 0.0
            for name, imp in self._importers.items():
                hold |= self._judge(name, imp, now)
                if imp.in_sync:
                    worst = max(worst, self.lag_of(imp.seq, now))
            self.worst = worst
        self._trim(oldest)
        self._account(hold, now)
        return not hold

    def _over(self, imp: _Importer, lag: float, share: float) -> bool:
        behind = (self._seqs[-1] - imp.seq) if self._seqs else 0
        return lag > self.max_lag * share or (self.max_messages > 0 and behind > self.max_messages * share)

    def _judge(self, name: str, imp: _Importer, now: float) -> bool:
        lag = self.lag_of(imp.seq, now)
        if not imp.in_sync:
            if not self._over(imp, lag, 0.5):
                imp.in_sync, imp.over_since = True, None
                log.info("importer %s is in sync (%.1fs behind); ingest waits for it beyond %.0fs",
                         name, lag, self.max_lag)
            return False
        if not self._over(imp, lag, 1.0):
            imp.over_since = None
            return False
        if imp.over_since is None:
            imp.over_since = now
        elif now - imp.over_since > self.evict_after:
            imp.in_sync = False
            log.warning("importer %s has been more than %.0fs behind for %.0fs; ingest no longer waits for it",
                        name, self.max_lag, now - imp.over_since)
            return False
        return True

    def _trim(self, oldest: int | None) -> None:
        """Forget samples no reporting importer needs (all of them but the last without importers)."""
        keep = oldest if oldest is not None else (self._seqs[-1] if self._seqs else 0)
        i = bisect.bisect_right(self._seqs, keep) - 1
        if i > 256:
            del self._seqs[:i], self._times[:i]

    def _account(self, hold: bool, now: float) -> None:
        if hold and self._held_from is None:
            self._held_from = now
        elif not hold and self._held_from is not None:
            self.held_seconds += now - self._held_from
            self._held_from = None
        self.holding = hold

    def held_total(self, now: float) -> float:
        return self.held_seconds + (now - self._held_from if self._held_from is not None else 0.0)
