"""Journal identity on real logjam-device processes: the id persists with its directory, a wiped
directory gets a new one, heartbeats and the replay endpoint announce it, and a new
subscriber's first message is a heartbeat carrying it.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest
import zmq

from logjam.meta import Meta
from logjam.producer import Producer
from logjam.replay import INFO, REPLAY, JournalChanged, JournalInfo, ReplayClient, ReplayTimeout, u64
from harness.device import start_device
from harness.processes import free_port, stop, wait_for
from tests.test_device_helpers import dealer, meta, push
from tests.test_device_journal import ENGINES, EVERYTHING, Journaled, send_acked

pytestmark = pytest.mark.timeout(90)

HEX16 = re.compile(r"[0-9a-f]{16}")


def info(endpoint: str) -> JournalInfo:
    client = ReplayClient(endpoint, timeout=5)
    try:
        return client.info()
    finally:
        client.close()


def first_message(sub: zmq.Socket, timeout: float = 20) -> list[bytes]:
    assert sub.poll(int(timeout * 1000)), "nothing was published to the new subscriber"
    return sub.recv_multipart()


def subscriber(pub: str) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.rcvhwm = 0
    sub.reconnect_ivl = 20
    sub.subscribe(b"")
    sub.connect(pub)
    return sub


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


def test_the_id_persists_across_restarts_and_changes_when_the_directory_is_wiped(tmp_path, engine):
    j = Journaled(tmp_path / "data", engine)
    try:
        dev = j.start()
        first = info(j.replay)
        assert HEX16.fullmatch(first.journal_id)
        assert (j.data_dir / "journal" / "journal-id").read_text() == first.journal_id + "\n"
        send_acked(dev.router, "a", 20)
        assert j.stop() == 0
        dev = j.start()
        assert info(j.replay).journal_id == first.journal_id
        send_acked(dev.router, "b", 20)
        j.kill()  # SIGKILL too: the id is on disk before the first append
        dev = j.start()
        again = info(j.replay)
        assert again.journal_id == first.journal_id and again.first == 1 and again.last > 40
        assert j.stop() == 0

        # A replaced disk: numbering starts again at 1, under a new id.
        shutil.rmtree(j.data_dir)
        dev = j.start()
        fresh = info(j.replay)
        assert HEX16.fullmatch(fresh.journal_id) and fresh.journal_id != first.journal_id
        assert fresh.first == 1 and fresh.last < 5  # the start heartbeat (and maybe a welcome one)
        client = ReplayClient(j.replay, timeout=5)
        try:
            with pytest.raises(JournalChanged) as changed:
                list(client.fetch(1, EVERYTHING, journal=first.journal_id))
            assert (changed.value.expected, changed.value.actual, changed.value.first) == (
                first.journal_id, fresh.journal_id, 1)
            replayed = list(client.fetch(1, EVERYTHING, journal=fresh.journal_id))
        finally:
            client.close()
        # The journal of a fresh directory starts with the heartbeat that names it.
        assert replayed[0].is_heartbeat and replayed[0].meta.seq == 1
        assert json.loads(replayed[0].body) == {"journal": fresh.journal_id, "first": 1}
        assert j.stop() == 0
    finally:
        if j.dev is not None and j.dev.proc.poll() is None:
            stop(j.dev.proc)


def test_a_subscriber_connected_before_the_start_first_gets_the_heartbeat_with_the_id(tmp_path):
    ports = {name: free_port() for name in ("router", "pull", "pub", "stats", "replay")}
    sub = subscriber(f"tcp://127.0.0.1:{ports['pub']}")  # nothing listens there yet
    data = tmp_path / "data"
    dev = start_device(extra=["--data-dir", str(data)], ports=ports)
    try:
        # Data flows at once; the subscriber may join before or after it started.
        with Producer(dev.router) as p:
            for i in range(20):
                assert p.request("shop-test", "logs.id", {"i": i})
        frames = first_message(sub)
        ident = info(f"tcp://127.0.0.1:{ports['replay']}")
        assert frames[0] == b"heartbeat", frames[:3]
        assert json.loads(frames[2]) == {"journal": ident.journal_id, "first": 1}
        # Everything after it is numbered after it.
        seq = Meta.unpack(frames[3]).seq
        while sub.poll(500):
            later = sub.recv_multipart()
            assert Meta.unpack(later[3]).seq > seq
            seq = Meta.unpack(later[3]).seq
    finally:
        sub.close()
        assert stop(dev.proc) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_subscriber_joining_mid_stream_first_gets_a_heartbeat(device_factory, engine):
    """Messages flow all the time; each new subscriber's first message is still a heartbeat."""
    dev = device_factory(native=engine, extra=["--heartbeat-interval", "60"])
    halt = threading.Event()

    def stream() -> None:
        s = push(dev.pull)
        try:
            while not halt.is_set():
                s.send_multipart([b"shop-test", b"logs.stream", b"{}", meta()])
        finally:
            s.close()

    sender = threading.Thread(target=stream)
    sender.start()
    try:
        ids = set()
        for _ in range(5):
            sub = subscriber(dev.pub)
            try:
                frames = first_message(sub)
                assert frames[0] == b"heartbeat", frames[:2]
                body = json.loads(frames[2])
                ids.add(body["journal"])
                # Without a journal nothing older than the heartbeat is held.
                assert body["first"] == Meta.unpack(frames[3]).seq
            finally:
                sub.close()
        assert len(ids) == 1 and HEX16.fullmatch(ids.pop())
    finally:
        halt.set()
        sender.join(10)


def test_without_a_journal_info_answers_and_replay_does_not(device_factory):
    replay_port = free_port()
    dev = device_factory(extra=["--replay-port", str(replay_port)])
    endpoint = f"tcp://127.0.0.1:{replay_port}"
    with Producer(dev.router) as p:
        for i in range(3):
            assert p.request("shop-test", "logs.x", {"n": i})
    got = info(endpoint)
    assert HEX16.fullmatch(got.journal_id)
    assert got.last >= 4 and got.first == got.last + 1  # the start heartbeat and three messages; none held
    client = ReplayClient(endpoint, timeout=0.5)
    try:
        with pytest.raises(ReplayTimeout):
            list(client.fetch(1, 10))
    finally:
        client.close()
    sub = subscriber(dev.pub)
    try:
        frames = first_message(sub)
        assert frames[0] == b"heartbeat" and json.loads(frames[2])["journal"] == got.journal_id
    finally:
        sub.close()
    assert stop(dev.proc) == 0
    # Its seqs restart with every start, so does its id.
    dev = device_factory(extra=["--replay-port", str(replay_port)])
    assert info(endpoint).journal_id != got.journal_id
    assert stop(dev.proc) == 0


def journal_bytes(directory: Path) -> int:
    """Bytes in the journal's segments; retention may delete one between listing and stat."""
    total = 0
    for f in directory.glob("*.journal"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_every_replay_answer_names_the_journal(tmp_path, engine):
    # Heartbeats are journaled too, and with 2 KiB segments a few of them roll a segment and let
    # retention move `first` again: none from the timer here, so only a subscriber's welcome one can.
    j = Journaled(tmp_path / "data", engine, ["--journal-segment-bytes", "2048", "--journal-retention-bytes", "8192",
                                              "--journal-fsync-interval-ms", "20", "--heartbeat-interval", "3600"])
    try:
        dev = j.start()
        send_acked(dev.router, "r", 300, window=5, pad=100)
        # Retention runs from the device's timer until the journal fits: wait for that, so `first` stays put.
        wait_for(lambda: journal_bytes(j.data_dir / "journal") <= 8192,
                 timeout=20, what="retention to delete the oldest segments")
        ident = info(j.replay)
        assert ident.first > 1
        s = dealer(j.replay)
        try:
            def ask(*frames: bytes) -> list[bytes]:
                s.send_multipart(list(frames))
                assert s.poll(5000)
                return s.recv_multipart()

            assert ask(INFO) == [INFO, ident.journal_id.encode(), u64(ident.first), u64(ident.last)]
            batch = ask(REPLAY, u64(ident.first), u64(ident.first + 2))
            assert batch[:3] == [b"batch", ident.journal_id.encode(), u64(ident.first + 3)] and len(batch) == 3 + 12
            assert ask(REPLAY, u64(1), u64(5)) == [b"gone", ident.journal_id.encode(), u64(ident.first)]
            end = ask(REPLAY, u64(10**12), u64(10**12))
            assert end[:2] == [b"end", ident.journal_id.encode()] and len(end) == 3
        finally:
            s.close()
        # The heartbeat's `first` is the oldest seq retention kept. The welcome heartbeat is journaled
        # itself and may let retention move `first` on: each answer is checked against `first` before
        # and after it.
        before = info(j.replay).first
        sub = subscriber(dev.pub)
        try:
            body = json.loads(first_message(sub)[2])
            assert body["journal"] == ident.journal_id and 1 < before <= body["first"] <= info(j.replay).first
        finally:
            sub.close()
        client = ReplayClient(j.replay, timeout=5)
        try:
            for rng in ((ident.first, ident.first + 5), (1, 5), (10**12, 10**12)):  # batch, gone, end
                before = info(j.replay).first
                with pytest.raises(JournalChanged) as changed:
                    list(client.fetch(*rng, journal="0123456789abcdef"))
                assert changed.value.actual == ident.journal_id
                assert before <= changed.value.first <= info(j.replay).first
                assert changed.value.reason == "journal_changed"
        finally:
            client.close()
        assert j.stop() == 0
    finally:
        if j.dev is not None and j.dev.proc.poll() is None:
            stop(j.dev.proc)
