"""Importer recovery bookkeeping: per-device checkpoints on disk and the sequence ledger that drives replay.

No sockets and no Spark here. `Checkpoints` persists, per worker, the highest sequence
number S per device such that everything of that device up to S is in Spark or was
filtered out. `Ledger` remembers, per device, the highest sequence number handed to the
batch pipeline ("covered") and classifies each arriving message: the next one, a
duplicate (already covered), or one that leaves a hole that replay must fill first.

The resume point after a crash is max(checkpoint, max(seq) in this worker's own table);
why that never writes a batch twice is explained in docs/reliability.md ("Importer recovery").
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from importer.paths import data_dir

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    return data_dir() / "importer"


class Checkpoints:
    """`<state dir>/worker-<I>.json`: {"worker": I, "devices": {"<device>": seq}}, replaced atomically."""

    def __init__(self, state_dir: Path, worker: int) -> None:
        self.path = Path(state_dir) / f"worker-{worker}.json"
        self.worker = worker
        self._lock = threading.Lock()
        self.seqs: dict[int, int] = {}

    def load(self) -> dict[int, int]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        # A checkpoint that cannot be read must stop the start, not silently restart from scratch.
        try:
            self.seqs = {int(k): int(v) for k, v in json.loads(text)["devices"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"unreadable checkpoint {self.path}: {e!r}") from e
        return dict(self.seqs)

    def advance(self, seqs: Mapping[int, int]) -> dict[int, int] | None:
        """Raise the stored seqs to `seqs` (never lower one) and persist; returns the new state if it changed.

        Called from the writer thread after a commit and from the main loop when nothing is in
        flight, hence the lock; taking the maximum makes the order of those calls irrelevant.
        """
        with self._lock:
            changed = False
            for device, seq in seqs.items():
                if seq > self.seqs.get(device, -1):
                    self.seqs[device] = seq
                    changed = True
            if not changed:
                return None
            self._write()
            return dict(self.seqs)

    def _write(self) -> None:
        atomic_write(self.path, json.dumps({"worker": self.worker,
                                            "devices": {str(k): v for k, v in sorted(self.seqs.items())}}))


def atomic_write(path: Path, data: str) -> None:
    """Write tmp, fsync, rename, fsync the directory: after a crash the file is the old or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_session_id(state_dir: Path, worker: int) -> tuple[str | None, str]:
    """(the previous run's Spark Connect session id or None, a fresh one now recorded in its place)."""
    path = Path(state_dir) / f"worker-{worker}.session"
    try:
        previous: str | None = path.read_text().strip() or None
    except FileNotFoundError:
        previous = None
    fresh = str(uuid.uuid4())
    atomic_write(path, fresh + "\n")
    return previous, fresh


def quiesce_previous_session(open_previous: Callable[[], Any], timeout: float = 30.0) -> int:
    """Interrupt whatever the previous run's Connect session is still executing; returns how many operations.

    A killed importer's last write keeps running on the Connect server, detached from its
    client, and could commit after our start-up read of max(seq); stopping it first keeps
    the resume point honest. Errors (a server restarted since, a closed session) mean there
    is nothing left to stop.
    """
    interrupted = 0
    try:
        spark = open_previous()
        deadline = time.monotonic() + timeout
        while True:
            ids = spark.interruptAll()
            if not ids:
                break
            interrupted += len(ids)
            if time.monotonic() > deadline:
                log.warning("the previous Spark session still reports operations %s after %.0fs", ids, timeout)
                break
            time.sleep(0.2)  # an interrupted operation needs a moment to wind down
    except Exception as e:  # pyspark raises many types for an unknown or closed session
        log.debug("previous Spark session: %s", e)
    if interrupted:
        log.warning("interrupted %d Spark operations the previous run left behind", interrupted)
    return interrupted


NEXT = 0
DUPLICATE = 1
HOLE = 2


class Ledger:
    """Per device: the highest seq handed to the pipeline (a batch or the filter). Device 0 is not tracked."""

    def __init__(self, resume: Mapping[int, int] | None = None) -> None:
        self.covered: dict[int, int] = dict(resume or {})
        self.duplicates: dict[int, int] = {}

    def classify(self, device: int, seq: int) -> int:
        """NEXT (hand it on), DUPLICATE (drop it), or HOLE (replay covered+1..seq-1 first).

        A device seen for the first time without a checkpoint starts at this message.
        """
        if device == 0:
            return NEXT
        covered = self.covered.get(device)
        if covered is None:
            self.covered[device] = seq - 1
            return NEXT
        if seq <= covered:
            self.duplicates[device] = self.duplicates.get(device, 0) + 1
            return DUPLICATE
        return NEXT if seq == covered + 1 else HOLE

    def cover(self, device: int, seq: int) -> None:
        if device != 0 and seq > self.covered.get(device, -1):
            self.covered[device] = seq

    def snapshot(self) -> dict[int, int]:
        return dict(self.covered)


def replay_endpoint(sub_endpoint: str, port: int) -> str:
    """`tcp://host:9606` -> `tcp://host:<port>`: a device serves replay on the host it publishes from."""
    base, sep, _ = sub_endpoint.rpartition(":")
    if not sep or "://" not in base:
        raise ValueError(f"cannot derive a replay endpoint from {sub_endpoint!r}")
    return f"{base}:{port}"
