"""The files of one partition directory on a local disk: its lock, its compaction marker, and strays.

A partition `(importer I, app_env A, date D)` always has the directory
`<table>/importer=I/app_env=A/date=D/` ("the partition dir"): that is where the importer's
partitioned Spark write puts new files. Until it is compacted the catalog's location for
the partition is that dir. Compaction (warehouse/compaction.py) writes the partition's rows
again into a hidden subdirectory `_compacted-<gen>/` and points the catalog there; from then on:
- files the importer writes into the partition dir are *strays*, invisible until moved into
  the current `_compacted-<gen>/` (the importer does that right after its write commits, under the
  lock, so a committed row is queryable at once);
- the files compaction replaced stay where they are for a grace period, so a query that
  listed them just before the swap can still read them, and are then deleted.
`_compaction.json` in the partition dir records which is which. Names starting with `_`
are skipped by every Spark reader, so none of this bookkeeping is ever read as data.

The lock is an flock on `<table>/importer=I/_lock`, held by the importer around each write
and by compaction and retention around each swap or delete.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from runtime.durable import fsync_dir, replace_file

MARKER = "_compaction.json"
LOCK = "_lock"
COMPACTED_PREFIX = "_compacted-"


@dataclass
class Marker:
    """What `_compaction.json` says. `state` is "swapping" from just before the catalog is changed until after.

    What a compaction replaced is kept until its own time (epoch seconds) has passed, each
    entry on its own clock: an open day's partition is compacted every few minutes, more
    often than the grace period, so one shared deadline would never come.
    """

    gen: int
    state: str = "done"
    retire: dict[str, float] = field(default_factory=dict)  # files of the partition dir replaced by `_compacted-<gen>/`
    retire_dirs: dict[str, float] = field(default_factory=dict)  # older `_compacted-<k>/` dirs replaced by it
    previous: dict | None = None  # while swapping: the marker to restore if the swap did not happen

    @property
    def location(self) -> str:
        return f"{COMPACTED_PREFIX}{self.gen}"


def _deadlines(raw: dict | list | None, default: float) -> dict[str, float]:
    # Markers written before per-entry deadlines held a list and one `retire_at`.
    if isinstance(raw, dict):
        return {str(k): float(v) for k, v in raw.items()}
    return {str(name): default for name in raw or []}


def is_data_file(path: Path) -> bool:
    name = path.name
    return not name.startswith(("_", ".")) and path.is_file()


def data_files(directory: Path) -> list[Path]:
    """The files a Spark reader would read directly in `directory` (not in hidden subdirectories)."""
    try:
        return sorted(p for p in directory.iterdir() if is_data_file(p))
    except FileNotFoundError:
        return []


def read_marker(partition_dir: Path) -> Marker | None:
    try:
        raw = json.loads((partition_dir / MARKER).read_text())
    except FileNotFoundError:
        return None
    return marker_from_dict(raw)


def marker_from_dict(raw: dict) -> Marker:
    at = float(raw.get("retire_at", 0.0))
    return Marker(gen=int(raw["gen"]), state=raw.get("state", "done"), retire=_deadlines(raw.get("retire"), at),
                  retire_dirs=_deadlines(raw.get("retire_dirs"), at), previous=raw.get("previous"))


def write_marker(partition_dir: Path, marker: Marker | None, *, fsync: str = "always") -> None:
    """Replace the marker atomically; None removes it. `fsync` is a runtime.config.FSYNC_POLICIES policy."""
    path = partition_dir / MARKER
    if marker is None:
        path.unlink(missing_ok=True)
        if fsync != "never":
            fsync_dir(partition_dir)
    else:
        replace_file(path, json.dumps(marker.__dict__).encode(), fsync=fsync)


@contextlib.contextmanager
def root_lock(root: Path | None) -> Iterator[None]:
    """Hold the flock of one importer's root (no-op for a root that is not on a local disk)."""
    if root is None:
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def strays(partition_dir: Path, marker: Marker) -> list[Path]:
    """Files in the partition dir that the compacted location does not hold yet."""
    retired = set(marker.retire)
    return [p for p in data_files(partition_dir) if p.name not in retired]


def relocate_strays(partition_dir: Path) -> int:
    """Move strays into the compacted location (caller holds the root lock). Returns how many moved.

    Only a finished compaction ("done") is followed: while a marker says "swapping", the
    compaction that wrote it died, and only the catalog knows where the partition is
    (table/compaction_protocol.py `recover` settles it).
    """
    marker = read_marker(partition_dir)
    if marker is None or marker.state != "done":
        return 0
    target = partition_dir / marker.location
    moved = 0
    for path in strays(partition_dir, marker):
        # One rename per file: each file's rows appear in the table whole, once.
        os.rename(path, target / path.name)
        moved += 1
    return moved


def delete_retired(partition_dir: Path, now: float | None = None) -> int:
    """Delete what finished compactions replaced once each entry's grace period is over. Returns bytes freed.

    The caller holds the table's compaction lock (warehouse/compaction.py `compaction_lock`).
    """
    marker = read_marker(partition_dir)
    now = time.time() if now is None else now
    if marker is None or marker.state != "done":
        return 0
    files = [name for name, at in marker.retire.items() if at <= now]
    dirs = [name for name, at in marker.retire_dirs.items() if at <= now]
    if not files and not dirs:
        return 0
    freed = 0
    for name in files:
        path = partition_dir / name
        with contextlib.suppress(FileNotFoundError):
            freed += path.stat().st_size
            path.unlink()
        del marker.retire[name]
    for name in dirs:
        freed += remove_tree(partition_dir / name)
        del marker.retire_dirs[name]
    # The caller holds the table's compaction lock, so no swap rewrites the marker meanwhile;
    # an importer only rewrites one that says "swapping".
    current = read_marker(partition_dir)
    if current is not None and current.state == "done" and current.gen == marker.gen:
        write_marker(partition_dir, marker)
    return freed


def remove_tree(path: Path) -> int:
    """Delete a directory tree, returning the bytes its files held (0 if it is gone already)."""
    freed = 0
    if not path.exists():
        return 0
    for sub, dirs, files in os.walk(path, topdown=False):
        for name in files:
            p = Path(sub) / name
            with contextlib.suppress(FileNotFoundError):
                freed += p.stat().st_size
                p.unlink()
        for name in dirs:
            with contextlib.suppress(FileNotFoundError):
                (Path(sub) / name).rmdir()
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()
    return freed


def partition_dirs(root: Path) -> Iterator[tuple[str, str, Path]]:
    """(escaped app_env, date, dir) for every partition dir below one importer's root."""
    try:
        app_dirs = sorted(root.iterdir())
    except FileNotFoundError:
        return
    for app_dir in app_dirs:
        if not app_dir.name.startswith("app_env=") or not app_dir.is_dir():
            continue
        for date_dir in sorted(app_dir.iterdir()):
            if date_dir.name.startswith("date=") and date_dir.is_dir():
                yield app_dir.name[len("app_env="):], date_dir.name[len("date="):], date_dir


def importer_roots(table_dir: Path) -> Iterator[tuple[int, Path]]:
    try:
        entries = sorted(table_dir.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith("importer=") and entry.is_dir():
            try:
                yield int(entry.name[len("importer="):]), entry
            except ValueError:
                continue


def live_files(partition_dir: Path) -> list[Path]:
    """The files a reader of the partition sees now: in `_compacted-<gen>/` once compacted, else in the dir itself."""
    marker = read_marker(partition_dir)
    if marker is not None and marker.state == "done":
        return data_files(partition_dir / marker.location)
    return data_files(partition_dir)
