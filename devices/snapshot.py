"""The device's state as metrics (devices/metrics.py) and its log lines read it: plain dicts, made on demand.

The loop keeps plain counters and objects; only a scrape or a log line pays for turning
them into these.
"""

from __future__ import annotations

import time
from typing import Any

from devices.hold import JournalHealth
from devices.journal import Journal
from devices.lag import ImporterLag
from devices.replay import ReplayServer


def importers_snapshot(lag: ImporterLag | None) -> dict[str, Any]:
    """Each importer's lag, and whether (and how long in all) the device held its input for them."""
    if lag is None:
        return {"lag": {}, "holding": False, "held_seconds": 0.0}
    now = time.monotonic()
    return {"lag": lag.lags(now), "holding": lag.holding, "held_seconds": lag.held_total(now)}


def journal_snapshot(journal: Journal | None, replay: ReplayServer | None, health: JournalHealth) -> dict[str, Any] | None:
    """The journal's size, range and writes, its health, and what the replay endpoint served; None without one."""
    if journal is None:
        return None
    return {
        "bytes": journal.size,
        "segments": journal.segment_count,
        "first_seq": journal.first_seq,
        "last_seq": journal.last_seq,
        "fsyncs": journal.fsyncs,
        "bytes_written": journal.bytes_written,
        "segments_deleted": journal.segments_deleted,
        **health.stats(),
        "replay_requests": replay.requests if replay else 0,
        "replay_messages": replay.served if replay else 0,
        "replay_bad_requests": replay.bad if replay else 0,
    }
