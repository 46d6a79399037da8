"""A bounded memory of the event ids an importer worker wrote recently, so that one event lands once.

A device can journal one event twice under two sequence numbers: a bridge's DeviceLink
resends requests whose 202 it never got, a segment or rustlog bridge forwards its stored
backlog again at start-up, a Logjam client resends after a lost 202. Sequence-based
recovery cannot tell those copies apart; the idempotency key in the body
(`@metadata._id`, see docs/reliability.md) can. `RecentKeys` remembers the last
`capacity` keys in the order they were first seen and forgets the oldest one when a new
one arrives at capacity, so memory stays bounded and a duplicate older than the last
`capacity` keyed events is no longer recognised.

Pure: no I/O. The caller decides what a key is (the importer scopes it by stream). This is
the twin the importer uses under LOGJAM_NATIVE=off; otherwise the same memory is in C
(native/dedupe.c, importer/decode_native.py `NativeRecentKeys`), where the C decoder asks it
about each row, and tests/test_importer_dedupe.py holds the two to the same answers.
"""

from __future__ import annotations

from typing import Iterable

DEFAULT_CAPACITY = 1_000_000


class RecentKeys:
    """The last `capacity` distinct keys; `seen(key)` answers and remembers in one step."""

    __slots__ = ("capacity", "_keys", "_ring", "_next")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._keys: set[str] = set()
        # Keys in the order they were first seen; once full it is a ring and `_next` is the oldest slot.
        # A list of references costs 8 bytes a key, against ~2x that for a deque or an OrderedDict.
        self._ring: list[str] = []
        self._next = 0

    def seen(self, key: str) -> bool:
        """True if `key` is among the remembered ones (a duplicate); otherwise remember it and return False."""
        keys = self._keys
        if key in keys:
            return True
        keys.add(key)
        ring = self._ring
        if len(ring) < self.capacity:
            ring.append(key)
        else:
            i = self._next
            keys.discard(ring[i])
            ring[i] = key
            self._next = (i + 1) % self.capacity
        return False

    def extend(self, keys: Iterable[str]) -> int:
        """Remember `keys`, oldest first (as when reloading what was written); returns how many were new."""
        added = 0
        for key in keys:
            if not self.seen(key):
                added += 1
        return added

    def oldest_first(self) -> list[str]:
        """The keys remembered, oldest first: what `extend` takes to remember the same in the same order."""
        return self._ring[self._next:] + self._ring[: self._next]

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)
