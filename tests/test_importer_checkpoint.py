"""The importer's recovery bookkeeping without sockets: checkpoint files, resume points, the sequence ledger, flags."""

from __future__ import annotations

import json
import os

import pytest

from importer.checkpoint import Checkpoints, Position, default_state_dir, new_session_id, resume_positions
from importer.sequence import DUPLICATE, HOLE, NEXT, Ledger, replay_endpoint

J, K = "0123456789abcdef", "fedcba9876543210"


def test_checkpoints_persist_atomically_and_never_go_back(tmp_path) -> None:
    cp = Checkpoints(tmp_path / "state", 2)
    assert cp.load() == {}
    assert cp.advance({1: Position(J, 10), 7: Position(None, 3)}) == {1: Position(J, 10), 7: Position(None, 3)}
    # An older mark (the writer thread racing the idle path) changes nothing and writes nothing.
    mtime = os.stat(cp.path).st_mtime_ns
    assert cp.advance({1: Position(J, 9)}) is None
    assert os.stat(cp.path).st_mtime_ns == mtime
    assert cp.advance({1: Position(J, 12)}) == {1: Position(J, 12), 7: Position(None, 3)}
    assert json.loads(cp.path.read_text()) == {"worker": 2, "devices": {"1": {"journal": J, "seq": 12},
                                                                        "7": {"journal": None, "seq": 3}}}
    assert list(cp.path.parent.iterdir()) == [cp.path], "no temporary file left behind"
    assert Checkpoints(tmp_path / "state", 2).load() == {1: Position(J, 12), 7: Position(None, 3)}
    # A new journal starts over, even at a lower seq.
    assert cp.advance({1: Position(K, 5)}) == {1: Position(K, 5), 7: Position(None, 3)}


def test_a_checkpoint_from_before_journal_ids_still_loads(tmp_path) -> None:
    (tmp_path / "worker-0.json").write_text('{"worker": 0, "devices": {"1": 12, "7": 3}}')
    assert Checkpoints(tmp_path, 0).load() == {1: Position(None, 12), 7: Position(None, 3)}


def test_an_unreadable_checkpoint_stops_the_start(tmp_path) -> None:
    for text in ("{not json", '{"worker": 0}', '{"devices": {"1": "x"}}', "[]", '{"devices": {"1": {"seq": 1, "journal": 5}}}'):
        (tmp_path / "worker-0.json").write_text(text)
        with pytest.raises(ValueError, match="unreadable checkpoint"):
            Checkpoints(tmp_path, 0).load()


def test_resume_is_the_checkpoint_raised_to_the_tables_max_seq_of_the_same_journal() -> None:
    saved = {1: Position(J, 100), 2: Position(J, 50)}
    in_table = {1: {J: (180, 2), K: (900, 1)},   # commit after the checkpoint; an older journal is ignored
                2: {J: (40, 5)},                   # checkpoint ahead (trailing filtered-out messages)
                3: {J: (7, 1), K: (3, 9)}}         # no checkpoint: the journal ingested last
    assert resume_positions(saved, in_table) == {1: Position(J, 180), 2: Position(J, 50), 3: Position(K, 3)}
    assert resume_positions({}, {}) == {}
    # A checkpoint written before journal ids: the table's journal and max(seq) where the table knows one.
    assert resume_positions({1: Position(None, 5)}, {1: {J: (90, 1)}}) == {1: Position(J, 90)}
    assert resume_positions({1: Position(None, 95)}, {1: {None: (90, 1)}}) == {1: Position(None, 95)}


def test_ledger_classifies_next_duplicate_and_hole() -> None:
    ledger = Ledger({1: Position(None, 100)})
    assert ledger.classify(1, 101) == NEXT
    ledger.cover(1, 101)
    assert ledger.classify(1, 101) == DUPLICATE
    assert ledger.classify(1, 50) == DUPLICATE  # a device restart: the journal keeps seqs going, so this was seen
    assert ledger.classify(1, 105) == HOLE
    # A device without a checkpoint starts at its first message; device 0 is never tracked.
    assert ledger.classify(9, 5000) == NEXT and ledger.seq(9) == 4999
    assert ledger.classify(0, 1) == ledger.classify(0, 1) == NEXT and 0 not in ledger.covered
    assert ledger.duplicates == {1: 2}
    assert ledger.snapshot() == {1: Position(None, 101), 9: Position(None, 4999)}


def test_replay_endpoint_and_defaults(tmp_path, monkeypatch) -> None:
    assert replay_endpoint("tcp://10.0.0.5:9606", 9607) == "tcp://10.0.0.5:9607"
    assert replay_endpoint("tcp://[::1]:9606", 1234) == "tcp://[::1]:1234"
    with pytest.raises(ValueError):
        replay_endpoint("ipc-without-port", 9607)
    monkeypatch.setenv("LOGJAM_DATA_DIR", str(tmp_path))
    assert default_state_dir() == tmp_path / "importer"
    assert new_session_id(tmp_path, 0)[0] is None
    previous, fresh = new_session_id(tmp_path, 0)
    assert previous is not None and previous != fresh
    assert new_session_id(tmp_path, 0)[0] == fresh


def test_recovery_flags() -> None:
    from importer.cli import build_parser

    args = build_parser().parse_args([])
    assert (args.state_dir, args.replay_port, args.no_replay) == (None, 9607, False)
    args = build_parser().parse_args(["--state-dir", "/s", "--replay-port", "1", "--no-replay"])
    assert (args.state_dir, args.replay_port, args.no_replay) == ("/s", 1, True)
