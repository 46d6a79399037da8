"""`RateLimitedLog`: log lines that a flood of peers can trigger, at a bounded rate.

Used for refusals (the bridges' connection limits and TLS handshakes, the devices'
CURVE refusals): unlimited, the log itself becomes the attack, and a full stderr pipe
stops the process.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("logjam")


class RateLimitedLog:
    """At most `burst` lines per `period` seconds; the next line after a period says how many were dropped.

    For what a flood of clients can trigger: unlimited, the log itself becomes the attack
    (and a full stderr pipe stops the event loop)."""

    def __init__(self, burst: int = 10, period: float = 10.0, level: int = logging.WARNING) -> None:
        self.level = level
        self.burst = burst
        self.period = period
        self._window_start = time.monotonic()
        self._logged = 0
        self._suppressed = 0

    def __call__(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= self.period:
            if self._suppressed:
                log.log(self.level, "%d more like it in the last %.0fs not logged", self._suppressed, now - self._window_start)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self.burst:
            self._logged += 1
            log.log(self.level, msg, *args)
        else:
            self._suppressed += 1
