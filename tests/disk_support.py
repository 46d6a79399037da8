"""Full disks for the tests: a small tmpfs with a filler file, or a process's RLIMIT_FSIZE.

`small_tmpfs` mounts a real tmpfs (this sandbox runs as root); where mounting is not
allowed the test is skipped with the reason. `fill` leaves a given number of bytes
free by writing a filler file that the test later deletes to give the space back.
`limit_file_size` lowers a running process's file-size limit: Python ignores SIGXFSZ,
so its writes past the limit fail with EFBIG, and raising the limit again ends that.
"""

from __future__ import annotations

import os
import resource
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); the RLIMIT_FSIZE tests cover this")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> Path:
    """Write `path/filler` until about `leave` bytes are free on its file system."""
    filler = path / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        while (room := free_bytes(path) - leave) > 0:
            f.write(chunk[: min(len(chunk), room)])
            f.flush()
            os.fsync(f.fileno())
    return filler


def limit_file_size(pid: int, limit: int | None) -> None:
    """Set the process's RLIMIT_FSIZE soft limit (None: back to the hard limit)."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if limit is None else limit, hard))
