"""The device's counters and stream-name bookkeeping, and the snapshot metrics and logs read.

The hot loop updates plain ints and dicts; the metrics collector reads a snapshot from
another thread (dict copies are atomic under the GIL), so counting never locks.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from devices.stamp import INVALID_LABEL, OTHER_LABEL
from logjam.validation import is_valid_app_env, is_valid_topic

if TYPE_CHECKING:
    from devices.hold import JournalHealth
    from devices.journal import Journal
    from devices.replay import ReplayServer

log = logging.getLogger("logjam-device")

# Remembered valid stream names and topics; past this, new names are checked every
# time instead (a client inventing names must not grow the device without bound).
NAME_CACHE = 10_000
LABELS_MAX = 10_000


class Counters:
    """Base of `Device`: what it counted, and the name caches behind its checks."""

    journal: Journal | None
    replay: ReplayServer | None
    health: JournalHealth
    journal_id: str

    def __init__(self) -> None:
        self.seq = 0
        self.received = {"router": 0, "pull": 0}
        self.published = 0
        self.heartbeats = 0
        self.last_heartbeat = time.monotonic()  # for /healthz: the loop is alive and publishing
        self.pings = 0
        self.per_app_env: dict[bytes, int] = {}
        self.other_app_envs = 0
        self.dropped: dict[tuple[str, str], int] = {}
        self._topics: set[bytes] = set()
        self._drop_labels: set[bytes] = set()

    def _drop(self, reason: str, app_env: bytes | None) -> None:
        if app_env is None:
            name = INVALID_LABEL
        else:
            name = self._label(app_env)
        key = (reason, name)
        self.dropped[key] = self.dropped.get(key, 0) + 1
        log.debug("dropped a message (%s) from %s", reason, name)

    def _label(self, app_env: bytes) -> str:
        """The drop label: valid names as themselves, at most LABELS_MAX of them."""
        if app_env in self.per_app_env or app_env in self._drop_labels:
            return app_env.decode("ascii")
        if not is_valid_app_env(app_env):
            return INVALID_LABEL
        if len(self._drop_labels) >= LABELS_MAX:
            return OTHER_LABEL
        self._drop_labels.add(app_env)
        return app_env.decode("ascii")

    def _new_app_env(self, app_env: bytes) -> bool:
        """Slow path of the stream-name check: validate, and remember it for the fast path."""
        if not is_valid_app_env(app_env):
            return False
        if len(self.per_app_env) < NAME_CACHE:
            self.per_app_env[app_env] = 0
        return True

    def _new_topic(self, topic: bytes) -> bool:
        if not is_valid_topic(topic):
            return False
        if len(self._topics) < NAME_CACHE:
            self._topics.add(topic)
        return True

    def _count_app_env(self, app_env: bytes) -> None:
        # Reached only for a name seen for the first time: it was just cached with 0,
        # or the cache is full and it is counted under one shared label.
        per = self.per_app_env
        if app_env in per:
            per[app_env] += 1
        else:
            self.other_app_envs += 1

    def snapshot(self) -> dict[str, Any]:
        """A consistent-enough copy of the counters (dict copies are atomic under the GIL)."""
        return {
            "journal_id": self.journal_id,
            "seq": self.seq,
            "received": dict(self.received),
            "published": self.published,
            "heartbeats": self.heartbeats,
            "heartbeat_age": time.monotonic() - self.last_heartbeat,
            "pings": self.pings,
            "per_app_env": {k.decode("ascii", "replace"): v for k, v in dict(self.per_app_env).items()}
            | ({OTHER_LABEL: self.other_app_envs} if self.other_app_envs else {}),
            "dropped": dict(self.dropped),
            "journal": self._journal_snapshot(),
            "importers": self._importers_snapshot(),
        }

    def _importers_snapshot(self) -> dict[str, Any]:
        lag = getattr(self, "lag", None)
        if lag is None:
            return {"lag": {}, "holding": False, "held_seconds": 0.0}
        now = time.monotonic()
        return {"lag": lag.lags(now), "holding": lag.holding, "held_seconds": lag.held_total(now)}

    def _journal_snapshot(self) -> dict[str, Any] | None:
        journal, replay = self.journal, self.replay
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
            **self.health.stats(),
            "replay_requests": replay.requests if replay else 0,
            "replay_messages": replay.served if replay else 0,
            "replay_bad_requests": replay.bad if replay else 0,
        }
