"""Watching a Delta table from outside its writers, for the kill -9 tests (tests/test_commit_crash.py,
tests/test_maintenance.py): what its `_delta_log` says so far (`LogWatch`), which data files are on
disk, and a reader that polls the table twice a second and records every row that vanished or
doubled between two polls (`PollingReader`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Hashable, Iterable
from urllib.parse import unquote

from deltalake import DeltaTable

LOG_DIR = "_delta_log"


def parquet_on_disk(location: str | Path) -> set[str]:
    """Every data file under the table (relative paths, as the log names them), `_delta_log` aside."""
    root = str(location)
    out = set()
    for top, dirs, files in os.walk(root):
        if top == root:
            dirs[:] = [d for d in dirs if d != LOG_DIR]
        for f in files:
            if f.endswith(".parquet"):
                out.add(os.path.relpath(os.path.join(top, f), root))
    return out


class LogWatch:
    """The commits `_delta_log` holds, read as they appear (each entry once; an entry log cleanup deleted
    stays known)."""

    def __init__(self, location: str | Path) -> None:
        self.dir = Path(location) / LOG_DIR
        self.entries: dict[int, list[dict]] = {}

    def names(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except FileNotFoundError:
            return []

    def scan(self) -> LogWatch:
        for name in self.names():
            stem, dot, ext = name.partition(".")
            if ext != "json" or not stem.isdigit() or int(stem) in self.entries:
                continue
            try:
                text = (self.dir / name).read_text()
            except FileNotFoundError:  # log cleanup took it meanwhile
                continue
            self.entries[int(stem)] = [json.loads(line) for line in text.splitlines() if line.strip()]
        return self

    def latest(self) -> int:
        return max(self.entries, default=-1)

    def added(self, since: int = -1) -> set[str]:
        """The data files the `add`s of the entries after version `since` name."""
        return {unquote(a["add"]["path"]) for v, actions in self.entries.items() if v > since
                for a in actions if "add" in a}

    def operations(self, since: int = -1) -> list[tuple[int, str]]:
        """(version, commitInfo.operation) of the entries after `since`, oldest first."""
        return [(v, a["commitInfo"].get("operation", "")) for v, actions in sorted(self.entries.items())
                if v > since for a in actions if "commitInfo" in a]

    def count(self, operation: str, since: int = -1) -> int:
        return sum(1 for _, op in self.operations(since) if op == operation)

    def txns(self, version: int) -> dict[str, int]:
        return {a["txn"]["appId"]: int(a["txn"]["version"]) for a in self.entries.get(version, ()) if "txn" in a}


def freeze_when(proc: subprocess.Popen, ready: Callable[[], object], *, timeout: float, what: str,
                interval: float = 0.002) -> object:
    """Poll `ready` until it says something truthy, then SIGSTOP `proc` at once (a stopped process changes
    nothing more on disk, so the caller can look at what it left before it kills it); returns what
    `ready` said. Fails when `proc` exits first or after `timeout`."""
    deadline = time.monotonic() + timeout
    # The test's other threads (a reader, a writer) hold the GIL for up to the switch interval (5 ms)
    # at a time: switched more often, this loop sees a step that lasts milliseconds.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        while True:
            seen = ready()
            if seen:
                proc.send_signal(signal.SIGSTOP)
                return seen
            if proc.poll() is not None:
                raise AssertionError(f"the process exited (status {proc.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)
    finally:
        sys.setswitchinterval(switch)


def kill_9(proc: subprocess.Popen) -> None:
    """SIGKILL (a stopped process too) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


Key = Hashable


class PollingReader:
    """A reader of the table in a thread of its own: every `interval` seconds a fresh `DeltaTable` reads
    `columns` (with `filters`) and checks the rows against the previous poll's. A problem is a key held
    by two rows in one poll (`doubled`), or a key of the previous poll absent from this one (`vanished`)
    outside `atomic`. `atomic`: keys that may go, but only all of them in one poll and never to come
    back (rows a retention DELETE removes in one commit)."""

    def __init__(self, location: str | Path, columns: list[str], *, filters: list | None = None,
                 interval: float = 0.5, atomic: Iterable[Key] = ()) -> None:
        self.location, self.columns, self.filters, self.interval = str(location), columns, filters, interval
        self.atomic = frozenset(atomic)
        self.polls = 0
        self.most = 0  # the most rows one poll saw
        self.versions: list[int] = []
        self.problems: list[str] = []
        self.errors: list[str] = []  # reads that failed (a fresh snapshot could not be read)
        self._atomic_gone = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="polling-reader")
        self._thread.start()

    def _read(self) -> tuple[int, list[Key]] | None:
        if not DeltaTable.is_deltatable(self.location):
            return None
        table = DeltaTable(self.location)
        t = table.to_pyarrow_table(columns=self.columns, filters=self.filters)
        return table.version(), list(zip(*(t.column(c).to_pylist() for c in self.columns)))

    def _run(self) -> None:
        before: set[Key] = set()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                read = self._read()
            except Exception as e:  # noqa: BLE001 (reported by check())
                self.errors.append(f"poll {self.polls}: {type(e).__name__}: {e}"[:500])
                read = None
            if read is not None:
                version, keys = read
                now = set(keys)
                self.polls += 1
                self.versions.append(version)
                self.most = max(self.most, len(keys))
                if len(now) != len(keys):
                    seen: set[Key] = set()
                    twice = [k for k in keys if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
                    self.problems.append(f"version {version}: {len(keys) - len(now)} keys doubled, e.g. {twice[:3]}")
                gone = before - now
                if gone - self.atomic:
                    self.problems.append(f"version {version}: {len(gone - self.atomic)} rows vanished "
                                         f"({len(before)} -> {len(now)}), e.g. {sorted(gone - self.atomic)[:3]}")
                held = now & self.atomic
                if held and (self._atomic_gone or held != self.atomic):
                    self.problems.append(f"version {version}: {len(held)} of {len(self.atomic)} rows of one "
                                         f"DELETE seen ({'after all had gone' if self._atomic_gone else 'partly'})")
                self._atomic_gone = self._atomic_gone or (bool(self.atomic) and not held)
                before = now
            self._stop.wait(max(0.0, started + self.interval - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the polling reader did not stop"

    def check(self, min_polls: int = 2) -> None:
        """Stop, then fail on any problem or failed read, or on fewer than `min_polls` polls."""
        self.stop()
        assert not self.problems, "the reader saw rows vanish or double:\n" + "\n".join(self.problems[:20])
        assert not self.errors, "the reader failed to read the table:\n" + "\n".join(self.errors[:20])
        assert self.polls >= min_polls, f"the reader polled {self.polls} times"

    def summary(self) -> str:
        return (f"reader: {self.polls} polls, versions {self.versions[:1]}..{self.versions[-1:]}, up to {self.most} "
                f"rows, {len(self.problems)} problems, {len(self.errors)} failed reads")
