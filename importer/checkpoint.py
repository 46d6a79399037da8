"""The checkpoint stage: per device, how far everything is in Spark, persisted atomically after each commit.

`Checkpoints` keeps `<state dir>/worker-<I>.json`: per device, the journal it is reading
(the id the device announces; None for a device that announces none) and the highest
sequence number S such that every message of that journal up to S is in Spark or was
filtered out. Why resuming from max(checkpoint, max(seq) in the table) never writes a
batch twice is explained in docs/reliability.md ("Importer recovery").
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from pathlib import Path
from typing import Mapping, NamedTuple

from logjam.defaults import data_root
from runtime.durable import replace_file

log = logging.getLogger(__name__)


class Position(NamedTuple):
    """Where a device's stream stands: its journal's id (None: unknown or none) and a sequence number."""

    journal: str | None
    seq: int


def default_state_dir() -> Path:
    return data_root() / "importer"


class Checkpoints:
    """`<state dir>/worker-<I>.json`, replaced atomically; positions never go back within one journal."""

    def __init__(self, state_dir: Path, worker: int) -> None:
        self.path = Path(state_dir) / f"worker-{worker}.json"
        self.worker = worker
        self._lock = threading.Lock()
        self.positions: dict[int, Position] = {}

    def load(self) -> dict[int, Position]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        # A checkpoint that cannot be read must stop the start, not silently restart from scratch.
        try:
            devices = json.loads(text)["devices"]
            self.positions = {int(k): _position(v) for k, v in devices.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"unreadable checkpoint {self.path}: {e!r}") from e
        return dict(self.positions)

    def advance(self, marks: Mapping[int, Position]) -> dict[int, Position] | None:
        """Persist `marks` where they move a device forward (or onto a new journal); returns the new state
        if it changed.

        Called from the writer thread after a commit and from the main loop when nothing is in
        flight, hence the lock; within one journal the maximum wins, so the order of calls
        does not matter.
        """
        with self._lock:
            changed = False
            for device, mark in marks.items():
                old = self.positions.get(device)
                if old is None or old.journal != mark.journal or mark.seq > old.seq:
                    self.positions[device] = mark
                    changed = True
            if not changed:
                return None
            data = {str(k): {"journal": p.journal, "seq": p.seq} for k, p in sorted(self.positions.items())}
            replace_file(self.path, json.dumps({"worker": self.worker, "devices": data}))
            return dict(self.positions)


    def snapshot(self) -> dict[int, Position]:
        with self._lock:
            return dict(self.positions)


def _position(value: object) -> Position:
    if isinstance(value, int):  # the format before journal ids
        return Position(None, value)
    if isinstance(value, dict):
        journal = value.get("journal")
        if journal is not None and not isinstance(journal, str):
            raise TypeError(f"journal must be a string, not {journal!r}")
        return Position(journal, int(value["seq"]))
    raise TypeError(f"unexpected checkpoint entry {value!r}")


def new_session_id(state_dir: Path, worker: int) -> tuple[str | None, str]:
    """(the previous run's Spark Connect session id or None, a fresh one now recorded in its place)."""
    path = Path(state_dir) / f"worker-{worker}.session"
    try:
        previous: str | None = path.read_text().strip() or None
    except FileNotFoundError:
        previous = None
    fresh = str(uuid.uuid4())
    replace_file(path, fresh + "\n")
    return previous, fresh


def resume_positions(saved: Mapping[int, Position],
                     in_table: Mapping[int, Mapping[str | None, tuple[int, object]]]) -> dict[int, Position]:
    """Where to resume per device: the checkpoint, raised to the table's max(seq) for the same journal.

    A device the checkpoint does not know (or knows only from before journal ids, while its
    rows in the table name their journal) resumes after its rows in the table; when those
    came from several journals, after the journal whose rows were ingested last.
    """
    resume: dict[int, Position] = {}
    for device in saved.keys() | in_table.keys():
        journals = in_table.get(device, {})
        mark = saved.get(device)
        latest = max(journals.items(), key=lambda item: (item[1][1] is not None, item[1][1])) if journals else None
        if mark is not None and (mark.journal is not None or latest is None or latest[0] is None):
            found = journals.get(mark.journal)
            resume[device] = Position(mark.journal, max(mark.seq, found[0]) if found else mark.seq)
        elif latest is not None:
            # No checkpoint, or one from before journal ids while the table knows the journal: the
            # table's own max(seq) is a safe resume point (everything after it is unwritten).
            journal, (seq, _) = latest
            resume[device] = Position(journal, seq)
    return resume
