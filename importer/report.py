"""What the importer counts per receive batch, published to its metrics at once, and the summaries it logs.

Gaps and skipped duplicate events come in floods, so they are logged as a summary at most
every few seconds; a lock per Prometheus increment is dear on the hot path, so counts of a
receive batch are added in one go.
"""

from __future__ import annotations

import logging
import time

from importer.metrics import ImporterMetrics
from logjam.subscriber import Gap

log = logging.getLogger("logjam-importer")

REPORT_INTERVAL = 5.0


class GapReport:
    """Gap counts per device (without replay) and skipped duplicate events, summarised every few seconds."""

    def __init__(self, metrics: ImporterMetrics) -> None:
        self.metrics = metrics
        self.total: dict[int, int] = {}
        self.recent: dict[int, int] = {}
        self.duplicate_events = 0
        self._reported_duplicates = 0
        self._next = time.monotonic() + REPORT_INTERVAL

    def gap(self, gap: Gap) -> None:
        device = str(gap.device)
        if gap.restart:
            self.metrics.device_restarts.labels(self.metrics.worker, device).inc()
            log.warning("device %d restarted or wrapped: sequence went from %d to %d", gap.device, gap.first, gap.last)
            return
        self.metrics.gap_messages.labels(self.metrics.worker, device).inc(gap.lost)
        self.total[gap.device] = self.total.get(gap.device, 0) + gap.lost
        self.recent[gap.device] = self.recent.get(gap.device, 0) + gap.lost

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + REPORT_INTERVAL
        for device, lost in sorted(self.recent.items()):
            log.warning("gaps: device %d lost %d messages in the last %.0fs (%d in total)",
                        device, lost, REPORT_INTERVAL, self.total[device])
        self.recent.clear()
        if self.duplicate_events > self._reported_duplicates:
            log.info("duplicates: skipped %d events whose @metadata._id was already written in the last %.0fs "
                     "(%d in total)", self.duplicate_events - self._reported_duplicates, REPORT_INTERVAL,
                     self.duplicate_events)
            self._reported_duplicates = self.duplicate_events


class Tally:
    """Counts of one receive batch, added to the Prometheus metrics at once."""

    __slots__ = ("received", "skipped", "rows", "errors", "duplicate_events")

    def __init__(self) -> None:
        self.received = self.skipped = 0
        self.rows: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.duplicate_events: dict[str, int] = {}

    def publish(self, metrics: ImporterMetrics) -> None:
        metrics.received.inc(self.received)
        metrics.skipped.inc(self.skipped)
        for app_env, n in self.rows.items():
            metrics.rows.labels(metrics.worker, app_env).inc(n)
        for app_env, n in self.errors.items():
            metrics.parse_errors.labels(metrics.worker, app_env).inc(n)
        for app_env, n in self.duplicate_events.items():
            metrics.duplicate_events.labels(metrics.worker, app_env).inc(n)
        self.received = self.skipped = 0
        self.rows, self.errors, self.duplicate_events = {}, {}, {}
