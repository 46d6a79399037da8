"""Full disks for the tests: a small tmpfs with a filler file, or a process's RLIMIT_FSIZE.

`small_tmpfs` mounts a real tmpfs (this sandbox runs as root); where mounting is not
allowed the test is skipped with the reason. `fill` leaves a given number of bytes
free by writing a filler file that the test later deletes to give the space back.
`limit_file_size` lowers a running process's file-size limit: Python ignores SIGXFSZ,
so its writes past the limit fail with EFBIG, and raising the limit again ends that.
`torn_bytes` says what a failed write left behind in a device journal.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from devices.journal import SUFFIX, Journal


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


def torn_bytes(journal_dir: Path) -> dict[str, int]:
    """The bytes a device starting on this journal would cut from each segment (torn or corrupt
    batches; none of them was acknowledged): the journal is copied aside and opened there, as a
    device opens it, so the original, perhaps still in use, is left as it is. `{}`: none."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "journal"
        shutil.copytree(journal_dir, copy)
        before = {p.name: p.stat().st_size for p in copy.glob(f"*{SUFFIX}")}
        Journal(copy).close()
        after = {p.name: p.stat().st_size for p in copy.glob(f"*{SUFFIX}")}
    return {name: size - after.get(name, 0) for name, size in before.items() if after.get(name, 0) != size}
