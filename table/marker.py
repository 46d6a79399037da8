"""A partition's marker, `_compaction.json`: what it says, when its retired entries may go, reading and writing it.

The states it records and who writes it are the commit protocol's (table/protocol.py,
docs/reliability.md). Grace deadlines run on the boot's monotonic clock, so a wall-clock step
never shortens one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logjam.errors import CorruptStore
from runtime.durable import fsync_dir, replace_file

MARKER = "_compaction.json"
COMPACTED_PREFIX = "_compacted-"


class TornMarker(CorruptStore):
    """`_compaction.json` does not parse: rebuilt from the catalog and the directory (`load_marker`)."""

    reason = "torn_marker"


# -- time ------------------------------------------------------------------------------------------------------------

def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


BOOT = _boot_id()


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a retired entry may go: on this boot's monotonic clock, with the wall clock for after a reboot.

    A query planned before a swap runs in a process of this boot (or of another machine, for
    which the wall clock is all there is), so the monotonic clock decides while the boot is
    the same: a forward step of the wall clock cannot delete files a planned query still reads.
    """

    boot: str
    mono: float
    wall: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(BOOT, time.monotonic() + seconds, time.time() + seconds)

    def passed(self, mono: float | None = None, wall: float | None = None) -> bool:
        if self.boot and self.boot == BOOT:
            return (time.monotonic() if mono is None else mono) >= self.mono
        return (time.time() if wall is None else wall) >= self.wall

    def to_json(self) -> dict[str, Any]:
        return {"boot": self.boot, "mono": self.mono, "wall": self.wall}

    @classmethod
    def from_json(cls, raw: Any) -> Deadline:
        if isinstance(raw, dict):
            return cls(str(raw.get("boot", "")), float(raw.get("mono", 0.0)), float(raw.get("wall", 0.0)))
        return cls("", 0.0, float(raw))  # markers before this module held epoch seconds


# -- the marker ------------------------------------------------------------------------------------------------------

@dataclass
class Marker:
    """What `_compaction.json` says. `state` is "swapping" from just before the catalog is changed until after."""

    gen: int
    state: str = "done"
    retire: dict[str, Deadline] = field(default_factory=dict)  # files of the dir replaced by `_compacted-<gen>/`
    retire_dirs: dict[str, Deadline] = field(default_factory=dict)  # older `_compacted-<k>/` dirs replaced by it
    previous: dict | None = None  # while swapping: the marker to restore if the swap did not happen

    @property
    def location(self) -> str:
        return f"{COMPACTED_PREFIX}{self.gen}"

    def to_json(self) -> dict[str, Any]:
        return {"gen": self.gen, "state": self.state, "previous": self.previous,
                "retire": {k: d.to_json() for k, d in self.retire.items()},
                "retire_dirs": {k: d.to_json() for k, d in self.retire_dirs.items()}}

    @classmethod
    def from_json(cls, raw: dict) -> Marker:
        at = raw.get("retire_at", 0.0)

        def deadlines(entries: Any) -> dict[str, Deadline]:
            if isinstance(entries, dict):
                return {str(k): Deadline.from_json(v) for k, v in entries.items()}
            return {str(name): Deadline.from_json(at) for name in entries or []}
        return cls(gen=int(raw["gen"]), state=str(raw.get("state", "done")), retire=deadlines(raw.get("retire")),
                   retire_dirs=deadlines(raw.get("retire_dirs")), previous=raw.get("previous"))


def read_marker(pdir: Path) -> Marker | None:
    """The marker of a partition dir, None without one; TornMarker when it does not parse."""
    try:
        text = (pdir / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    try:
        marker = Marker.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise TornMarker(f"{pdir / MARKER}: {e}") from e
    if marker.state not in ("done", "swapping"):
        raise TornMarker(f"{pdir / MARKER}: state {marker.state!r}")
    return marker


def write_marker(pdir: Path, marker: Marker | None) -> None:
    """Replace the marker durably (fsynced file and dir); None removes it."""
    path = pdir / MARKER
    if marker is None:
        path.unlink(missing_ok=True)
        fsync_dir(pdir)
    else:
        replace_file(path, json.dumps(marker.to_json()).encode())

