"""native/pick.c (importer/decode_native.py `NativePicker`) against the receive stage's Python loop
(importer/receive.py `Receiver._pick_ordered` without it): the same picks, in the same order, and the
same tallies (received, skipped, rows per stream) for the same chunks in sequence, names met for the
first time included; and through `Receiver.receive`, the same batch when the decoder's names are
numbered again (`tidy_names`). The C path is skipped under an outer LOGJAM_NATIVE=off."""

from __future__ import annotations

import array

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.native import c_module
from importer import decode_native
from importer.batch import GroupCommit
from importer.sequence import Position
from importer.decode_native import MODULE, NativeBatchBuilder
from importer.dedupe import RecentKeys
from importer.metrics import ImporterMetrics
from importer.receive import Receiver
from importer.report import GapReport, Tally
from importer.sequence import Ledger, Sequencer
from importer.split import StreamFilter
from logjam.raw import RawBatch

pytestmark = pytest.mark.native

DEVICE = 4
APP_ENVS = [b"shop-prod", b"other-prod", b"shop-test", b"", b"shop-\xff", b"other-\xe9t\xe9", b"shop"]
TOPICS = [b"logs", b"", b"logs.rails", b"l\xff", b"metrics"]


def chunk(names: list[tuple[bytes, bytes]], first_seq: int) -> RawBatch:
    """One device's messages, in sequence, with these (app-env, topic) frames and a small JSON body."""
    parts, pos, meta, at = [], array.array("I"), array.array("Q"), 0
    for k, (app_env, topic) in enumerate(names):
        for f in (app_env, topic, b'{"message":"m%d"}' % k):
            parts.append(f)
            pos.extend((at, len(f)))
            at += len(f)
        meta.extend((0, DEVICE, 1_795_000_000_000 + k, first_seq + k))
    return RawBatch("tcp://127.0.0.1:1", b"".join(parts), pos, meta, len(names))


class Side:
    """A Receiver with the C decoder and a real Sequencer, picking in C or (c=False) in its Python loop."""

    def __init__(self, c: bool) -> None:
        self.ctx = zmq.Context()
        metrics = ImporterMetrics(0)
        endpoints = {DEVICE: "tcp://127.0.0.1:1"}
        self.sequencer = Sequencer(Ledger({DEVICE: Position("j-4", 0)}), metrics, context=self.ctx,
                                   device_endpoint=dict(endpoints), replay_port=1, replay_timeout=1.0,
                                   stopping=lambda: False)
        self.group = GroupCommit(NativeBatchBuilder(c_module(MODULE), dedupe=RecentKeys()), flush_interval=1.0)
        self.tally = Tally()
        self.rec = Receiver(self.group, StreamFilter(prefixes=["shop"]), self.tally, GapReport(metrics),
                            self.sequencer, dict(endpoints))
        assert self.rec._picker is not None
        if not c:
            self.rec._picker = None

    def picks(self, raw: RawBatch) -> list[int]:
        """What `_pick_ordered` picks from `raw` (taken out before they are decoded)."""
        self.rec._pick_ordered(raw)
        got = self.rec._picks.tolist()
        del self.rec._picks[:]
        return got

    def tallies(self) -> tuple:
        t = self.tally
        return t.received, t.skipped, dict(t.rows), dict(t.duplicate_events), dict(t.errors)

    def close(self) -> None:
        self.ctx.term()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.sampled_from(APP_ENVS), st.sampled_from(TOPICS)), min_size=1, max_size=40),
                min_size=1, max_size=4))
def test_c_picks_as_the_python_loop(chunks: list[list[tuple[bytes, bytes]]]) -> None:
    c, py = Side(True), Side(False)
    try:
        for names in chunks:
            raw = chunk(names, 1)
            assert c.picks(raw) == py.picks(raw)
            assert c.tallies() == py.tallies()
    finally:
        c.close()
        py.close()


def test_many_names_and_a_chunk_without_a_kept_stream() -> None:
    """More names than the C tables start with (they grow), then a chunk of other workers' streams only."""
    c, py = Side(True), Side(False)
    try:
        names = [(b"shop%d-prod" % (k % 150), b"topic%d" % (k % 97)) for k in range(1200)]
        raw = chunk(names, 1)
        want = py.picks(raw)
        assert c.picks(raw) == want and len(want) == 4 * 1200
        raw = chunk([(b"other%d-prod" % k, b"logs") for k in range(300)], 1201)
        assert c.picks(raw) == py.picks(raw) == []
        assert c.tallies() == py.tallies()
        assert c.tallies()[:2] == (1500, 300) and sum(c.tallies()[2].values()) == 1200
    finally:
        c.close()
        py.close()


def test_the_same_batch_when_names_are_numbered_again(monkeypatch) -> None:
    """Through `receive`: chunks in sequence, picked in C, with the decoder's names dropped and numbered
    again between chunks (a low MAX_NAMES): the C tables are cleared with the receiver's caches."""
    monkeypatch.setattr(decode_native, "MAX_NAMES", 4)
    c, py = Side(True), Side(False)
    try:
        seq = 1
        for j in range(6):
            names = [(APP_ENVS[(k + j) % len(APP_ENVS)], TOPICS[(k * j) % len(TOPICS)]) for k in range(50)]
            raw = chunk(names, seq)
            seq += len(names)
            for side in (c, py):
                side.rec.receive([raw], lambda: False)
        assert c.tallies() == py.tallies()
        assert c.tallies()[0] == 300
        got, want = c.group.cut(None).table, py.group.cut(None).table
        assert got.num_rows == want.num_rows > 0
        assert got.drop(["ingested_at"]).equals(want.drop(["ingested_at"]))
        assert c.group.builder.generation > 0  # the names were numbered again
    finally:
        c.close()
        py.close()



@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([b"shop-prod", b"heartbeat", b"heartbeats", b"heartbea", b""]), min_size=1,
                max_size=30))
def test_a_heartbeat_is_found_by_its_app_env_alone(app_envs: list[bytes]) -> None:
    """`holds` answers as comparing each message's app-env frame; a topic with the bytes is no heartbeat."""
    side = Side(True)
    try:
        raw = chunk([(a, b"heartbeat") for a in app_envs], 1)
        assert b"heartbeat" in raw.data  # what searching the bytes would take for one
        picker = side.rec._picker
        assert picker is not None
        assert picker.holds(raw, b"heartbeat") == (b"heartbeat" in app_envs)
    finally:
        side.close()
