"""The device's counters and stream-name bookkeeping, and the snapshot metrics and logs read.

The device holds one `Counters` (`device.counters`). The hot loop updates its plain ints
and dicts; the metrics collector reads a snapshot from another thread (dict copies are
atomic under the GIL), so counting never locks.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from devices.stamp import INVALID_LABEL, OTHER_LABEL
from logjam.validation import is_valid_app_env, is_valid_topic

log = logging.getLogger("logjam-device")

# Remembered valid stream names and topics; past this, new names are checked every
# time instead (a client inventing names must not grow the device without bound).
NAME_CACHE = 10_000
LABELS_MAX = 10_000


class Counters:
    """What the device counted, and the name caches behind its checks."""

    def __init__(self) -> None:
        self.received = {"router": 0, "pull": 0}
        self.published = 0
        self.heartbeats = 0
        self.last_heartbeat = time.monotonic()  # for /healthz: the loop is alive and publishing
        self.pings = 0
        self.per_app_env: dict[bytes, int] = {}
        self.other_app_envs = 0
        self.dropped: dict[tuple[str, str], int] = {}
        self.topics: set[bytes] = set()
        self._drop_labels: set[bytes] = set()

    def drop(self, reason: str, app_env: bytes | None) -> None:
        if app_env is None:
            name = INVALID_LABEL
        else:
            name = self.label(app_env)
        key = (reason, name)
        self.dropped[key] = self.dropped.get(key, 0) + 1
        log.debug("dropped a message (%s) from %s", reason, name)

    def label(self, app_env: bytes) -> str:
        """The drop label: valid names as themselves, at most LABELS_MAX of them."""
        if app_env in self.per_app_env or app_env in self._drop_labels:
            return app_env.decode("ascii")
        if not is_valid_app_env(app_env):
            return INVALID_LABEL
        if len(self._drop_labels) >= LABELS_MAX:
            return OTHER_LABEL
        self._drop_labels.add(app_env)
        return app_env.decode("ascii")

    def new_app_env(self, app_env: bytes) -> bool:
        """Slow path of the stream-name check: validate, and remember it for the fast path."""
        if not is_valid_app_env(app_env):
            return False
        if len(self.per_app_env) < NAME_CACHE:
            self.per_app_env[app_env] = 0
        return True

    def new_topic(self, topic: bytes) -> bool:
        if not is_valid_topic(topic):
            return False
        if len(self.topics) < NAME_CACHE:
            self.topics.add(topic)
        return True

    def count_app_env(self, app_env: bytes) -> None:
        # Reached only for a name seen for the first time: it was just cached with 0,
        # or the cache is full and it is counted under one shared label.
        per = self.per_app_env
        if app_env in per:
            per[app_env] += 1
        else:
            self.other_app_envs += 1

    def count_batch(self, app_env_counts: list[tuple[bytes, int]]) -> None:
        """Accepted messages per stream of a batch the C path checked (names it validated)."""
        per_app = self.per_app_env
        for app, count in app_env_counts:
            if app in per_app:
                per_app[app] += count
            elif len(per_app) < NAME_CACHE:
                per_app[app] = count
            else:
                self.other_app_envs += count

    def heartbeat(self) -> None:
        self.heartbeats += 1
        self.last_heartbeat = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        """A consistent-enough copy of the counters (dict copies are atomic under the GIL)."""
        return {
            "received": dict(self.received),
            "published": self.published,
            "heartbeats": self.heartbeats,
            "heartbeat_age": time.monotonic() - self.last_heartbeat,
            "pings": self.pings,
            "per_app_env": {k.decode("ascii", "replace"): v for k, v in dict(self.per_app_env).items()}
            | ({OTHER_LABEL: self.other_app_envs} if self.other_app_envs else {}),
            "dropped": dict(self.dropped),
        }
