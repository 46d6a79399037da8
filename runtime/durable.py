"""Durable-file primitives every store uses: whole writes, directory fsyncs, atomic replacement.

`replace_file` is the one way a small file (an id, a checkpoint, a marker, metadata) is
replaced: write a temporary file beside it, fsync it, rename it over the old one, fsync
the directory. After a crash the path holds the old contents or the new ones, never a
mix, and under "always"/"interval" the new contents survive a power loss once it returns.
The fsync words are runtime/config.py's: "never" keeps the rename atomic against a process
kill and leaves the fsyncs to the page cache (for files whose loss only costs work again).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Sequence

from runtime.config import FSYNC_POLICIES


def write_all(fd: int, parts: Sequence[Any] | bytes | memoryview, offset: int | None = None) -> int:
    """Write every byte of `parts` (one buffer or a list of them); returns how many.

    One writev (pwritev at `offset`) per call where the kernel takes it all; a short write
    (the disk filling up) is continued, so that the failing call is the one that names
    the error (ENOSPC, EFBIG, EIO) as an OSError.
    """
    if isinstance(parts, (bytes, bytearray, memoryview)):
        parts = [parts]
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if len(v)]
    total = sum(len(v) for v in views)
    while views:
        n = os.writev(fd, views) if offset is None else os.pwritev(fd, views, offset)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        if offset is not None:
            offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return total


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a file someone else's writer wrote (a Parquet file pyarrow wrote), or a directory,
    so that its bytes, or a file created, renamed or removed in it, survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_file  # a directory is fsynced the same way; the name says what a caller means


def make_dirs(path: str | os.PathLike[str]) -> None:
    """Make a directory and its missing parents, each made one durable in its parent: a file renamed into
    it later is then not lost with the directory in a power loss."""
    path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not directory.is_dir():
                raise
        fsync_dir(directory.parent)


def replace_file(path: str | os.PathLike[str], data: bytes | str, *, fsync: str = "always") -> None:
    """Replace `path` with `data` atomically: write `<name>.tmp`, fsync it, rename it, fsync the directory.

    `fsync` is a policy of runtime.config.FSYNC_POLICIES; "never" skips both fsyncs (the
    rename stays atomic against a process kill). Missing parent directories are made.
    """
    if fsync not in FSYNC_POLICIES:
        raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, raw)
        if fsync != "never":
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync != "never":
        fsync_dir(path.parent)
