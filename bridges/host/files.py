"""Durable-file primitives shared by the bridges that store what they accept (segment, rustlog)."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until every byte is written (a single write may be short)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a file created, renamed or removed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
