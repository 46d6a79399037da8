"""A batch's placement: its staged files and their targets, named in a fsynced `<token>.moves` list, then renamed.

The importer's part of the commit protocol (table/protocol.py, docs/reliability.md): once a
list is durable its batch is finished, never written again, and a retry or a restart finishes
the same list, so that each file is placed once. Callers hold the importer root's lock
(`protocol.root_lock`); `protocol.recover_placements` finishes what a killed process listed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from runtime.durable import fsync_dir, replace_file

MOVES = ".moves"
Move = tuple[str, str]  # (staged file, target file in a partition dir)


def begin_placement(staging: Path, token: str, moves: list[Move], replaces: str | None = None) -> Path:
    """Name a batch's staged files and their targets in `<token>.moves`, durably: from here on the batch is
    finished, never written again (`finish_placement`). `replaces`: the token of a listed batch whose
    unplaced rest this batch carries (quarantine), abandoned once this list is durable."""
    listed = staging / f"{token}{MOVES}"
    replace_file(listed, json.dumps({"moves": moves, "replaces": replaces}))
    if replaces is not None:
        abandon_placement(staging, replaces)
    return listed


def read_list(listed: Path) -> tuple[list[Move], str | None]:
    """A list's moves, and the token of the batch whose rest it carries (None when it carries none)."""
    raw = json.loads(listed.read_text())
    if isinstance(raw, list):  # lists written before `replaces`
        return [(str(a), str(b)) for a, b in raw], None
    return [(str(a), str(b)) for a, b in raw["moves"]], raw.get("replaces")


def listed_targets(listed: Path) -> list[Move]:
    return read_list(listed)[0]


def finish_placement(listed: Path) -> int:
    """Rename every listed file still staged into its partition, make it durable, drop the list (lock held).

    A staged file that is gone was renamed by an earlier attempt: each file is placed once,
    however often this runs. Returns the files renamed now."""
    moves = listed_targets(listed)
    renamed = 0
    for staged, target in moves:
        if os.path.exists(staged):
            os.rename(staged, target)
            renamed += 1
    for directory in sorted({os.path.dirname(t) for _, t in moves}):
        fsync_dir(directory)
    listed.unlink()
    fsync_dir(listed.parent)
    return renamed


def abandon_placement(staging: Path, token: str) -> None:
    """Forget a listed batch: its staged files first, then its list (whose rest another list carries)."""
    listed = staging / f"{token}{MOVES}"
    if listed.exists():
        for staged, _ in listed_targets(listed):
            Path(staged).unlink(missing_ok=True)
        listed.unlink()
        fsync_dir(staging)

