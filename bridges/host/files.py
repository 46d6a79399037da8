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


def store_id(root: Path) -> str:
    """The random id of the store under `root`, made once and kept in `root/store-id`.

    Idempotency keys of stored events are `<store-id>:<position>`: stable across
    restarts of the bridge, and distinct between two bridges with their own stores.
    """
    path = root / "store-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"store-id.{os.getpid()}.tmp"
    tmp.write_text(os.urandom(8).hex() + "\n")
    os.replace(tmp, path)
    fsync_dir(root)
    return path.read_text().strip()
