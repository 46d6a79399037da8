"""The real logjam-device with --data-dir: journal before publish and 202, replay, restarts, retention.

Every test runs real `logjam-device` processes on random ports with a temporary data
directory and reads the journal back only through the real replay port.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import zmq

from logjam.message import Message
from logjam.meta import Meta
from logjam.producer import Producer
from logjam.replay import REPLAY, Lost, ReplayClient, u64
from harness.device import DeviceProcess, start_device
from harness.processes import command, free_port, start, stop, wait_for
from tests.test_device_helpers import Tap, dealer, meta, push, scrape

pytestmark = pytest.mark.timeout(90)

# LOGJAM_NATIVE for the device: the C loop, then the Python loop.
ENGINES = ["require", "off"]
EVERYTHING = 2**63


class Journaled:
    """A device with a journal, restartable on the same data directory."""

    def __init__(self, data_dir: Path, engine: str, extra: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.engine = engine
        self.extra = list(extra or [])
        self.dev: DeviceProcess | None = None
        self.replay_port = 0
        self.metrics_port = 0

    def start(self, flags: list[str] | None = None) -> DeviceProcess:
        self.replay_port, self.metrics_port = free_port(), free_port()
        self.dev = start_device(native=self.engine, extra=[
            "--replay-port", str(self.replay_port),
            "--metrics-port", str(self.metrics_port), *(flags if flags is not None else ["--data-dir", str(self.data_dir)]),
            *self.extra,
        ])
        return self.dev

    @property
    def replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def fetch(self, first: int = 1, last: int = EVERYTHING) -> list[Message | Lost]:
        client = ReplayClient(self.replay, timeout=5)
        try:
            return list(client.fetch(first, last))
        finally:
            client.close()

    def stop(self) -> int:
        assert self.dev is not None
        return stop(self.dev.proc)

    def kill(self) -> None:
        assert self.dev is not None
        self.dev.proc.send_signal(signal.SIGKILL)
        self.dev.proc.wait(10)


@pytest.fixture(params=ENGINES)
def journaled(request, tmp_path):
    made: list[Journaled] = []

    def make(extra: list[str] | None = None) -> Journaled:
        j = Journaled(tmp_path / "data", request.param, extra)
        made.append(j)
        return j

    yield make
    for j in made:
        if j.dev is not None and j.dev.proc.poll() is None:
            stop(j.dev.proc)


def messages(items: list[Message | Lost]) -> list[Message]:
    assert all(isinstance(m, Message) for m in items), [m for m in items if isinstance(m, Lost)][:3]
    return items  # type: ignore[return-value]


def assert_consecutive(msgs: list[Message], first: int = 1) -> None:
    seqs = [m.meta.seq for m in msgs]
    assert seqs == list(range(first, first + len(seqs))), f"not consecutive from {first}: {seqs[:5]}...{seqs[-5:]}"


def bodies(msgs: list[Message], app: str = "shop-test") -> list[bytes]:
    return [m.body for m in msgs if m.app_env == app]


def send_acked(endpoint: str, tag: str, count: int, window: int = 50, pad: int = 0) -> list[bytes]:
    """Pipelined requests on a raw DEALER; returns the bodies whose 202 arrived, in order.

    Replies on one connection come back in request order, so the k-th reply acknowledges
    the k-th request.
    """
    s = dealer(endpoint)
    sent: list[bytes] = []
    acked: list[bytes] = []
    try:
        while len(acked) < count:
            while len(sent) < count and len(sent) - len(acked) < window:
                body = json.dumps({"tag": tag, "i": len(sent)} | ({"pad": "x" * pad} if pad else {})).encode()
                s.send_multipart([b"", b"shop-test", b"logs.journal", body, meta(seq=len(sent) + 1)])
                sent.append(body)
            if not s.poll(5000):
                break
            reply = s.recv_multipart()
            assert reply == [b"shop-test", b"202 Accepted"], reply
            acked.append(sent[len(acked)])
    finally:
        s.close()
    return acked


# -- acknowledged means journaled: replay equals what was published -------------------------

def test_every_accepted_message_is_replayable_as_published(journaled):
    j = journaled(["--heartbeat-interval", "0.05"])
    dev = j.start()
    tap = Tap(dev.pub, dev.pull, keep_heartbeats=True)
    try:
        acked = send_acked(dev.router, "a", 300)
        assert len(acked) == 300
        p = push(dev.pull)
        for i in range(200):
            p.send_multipart([b"shop-test", b"logs.push", b"push-%d" % i, meta(created_ms=1_700_000_000_000 + i)])
        p.send_multipart([b"shop-test", b"logs.push", b"legacy"])  # 3-frame: gets a fresh meta
        p.close()
        published: dict[int, list[bytes]] = {}

        def all_published() -> bool:
            # Heartbeats never stop, so take what is there for a moment, then look.
            until = time.monotonic() + 0.3
            while time.monotonic() < until and (frames := tap.recv(0.1)) is not None:
                published[Meta.unpack(frames[3]).seq] = frames
            return any(f[2] == b"legacy" for f in published.values())

        wait_for(all_published, timeout=20, what="the PUSHed messages to be published")
        # Heartbeats every 50 ms keep coming; make sure at least one is in the range.
        wait_for(lambda: all_published() and any(f[0] == b"heartbeat" for f in published.values()),
                 timeout=10, what="a heartbeat")
        replayed = messages(j.fetch())
    finally:
        tap.close()

    assert_consecutive(replayed)
    assert bodies(replayed)[:300] == acked
    assert bodies(replayed)[300:] == [b"push-%d" % i for i in range(200)] + [b"legacy"]
    assert any(m.is_heartbeat for m in replayed)
    by_seq = {m.meta.seq: m for m in replayed}
    for seq, frames in published.items():
        assert by_seq[seq].to_frames() == frames, seq  # byte for byte: app, topic, body, stamped meta
    for m in replayed:
        assert m.meta.device == 1
    pushed = [m for m in replayed if m.topic == "logs.push" and m.body != b"legacy"]
    assert [m.meta.created_ms for m in pushed] == [1_700_000_000_000 + i for i in range(200)]

    # Partial ranges, and nothing past the end.
    mid = replayed[len(replayed) // 2].meta.seq
    assert [m.meta.seq for m in j.fetch(mid, mid + 2)] == [mid, mid + 1, mid + 2]
    assert j.fetch(10**12, 10**12 + 5) == []

    metrics = scrape(j.metrics_port)
    assert metrics[("logjam_device_journal_last_seq", ())] >= replayed[-1].meta.seq
    assert metrics[("logjam_device_journal_segments", ())] == 1
    assert metrics[("logjam_device_journal_bytes", ())] > 500 * 24
    assert metrics[("logjam_device_replay_messages_total", ())] >= len(replayed)
    assert metrics[("logjam_device_replay_requests_total", ())] >= 2
    assert j.stop() == 0


def test_always_fsync_policy_counts_fsyncs(journaled):
    j = journaled(["--journal-fsync", "always"])
    dev = j.start()
    assert len(send_acked(dev.router, "f", 50, window=1)) == 50
    metrics = scrape(j.metrics_port)
    # One request at a time: every request is its own batch, each fsynced before its 202.
    assert metrics[("logjam_device_journal_fsyncs_total", ())] >= 50
    assert bodies(messages(j.fetch()))[-50:] == [json.dumps({"tag": "f", "i": i}).encode() for i in range(50)]
    assert j.stop() == 0


# -- restarts ------------------------------------------------------------------------------

def test_sequence_continues_after_sigterm_restart_with_a_toml_config(journaled, tmp_path):
    j = journaled()
    dev = j.start()
    first = send_acked(dev.router, "before", 100)
    assert j.stop() == 0
    config = tmp_path / "device.toml"
    config.write_text(f'data-dir = "{j.data_dir}"\njournal-fsync = "os"\n')
    dev = j.start(["--config", str(config)])
    second = send_acked(dev.router, "after", 100)
    replayed = messages(j.fetch())
    assert_consecutive(replayed)
    assert bodies(replayed) == first + second
    assert j.stop() == 0
    # And once more, with nothing sent: the numbering still continues (a heartbeat at most).
    dev = j.start()
    third = send_acked(dev.router, "third", 1)
    replayed = messages(j.fetch())
    assert_consecutive(replayed)
    assert bodies(replayed) == first + second + third


@pytest.mark.parametrize("policy", ["never", "interval"])
def test_every_acknowledged_message_survives_sigkill(journaled, policy):
    j = journaled(["--journal-fsync", policy])
    dev = j.start()
    acked: dict[int, list[bytes]] = {}
    stop_sending = threading.Event()

    def client(n: int) -> None:
        # Keeps sending until the device dies under it; records what was acknowledged.
        s = dealer(dev.router, zmq.Context.instance())
        sent: list[bytes] = []
        got: list[bytes] = []
        acked[n] = got
        try:
            while not stop_sending.is_set() or len(sent) > len(got):
                while not stop_sending.is_set() and len(sent) - len(got) < 20:
                    body = json.dumps({"c": n, "i": len(sent)}).encode()
                    s.send_multipart([b"", b"shop-test", b"logs.kill", body, meta()])
                    sent.append(body)
                if not s.poll(1000):
                    return  # the device is gone: the rest was never acknowledged
                assert s.recv_multipart()[1] == b"202 Accepted"
                got.append(sent[len(got)])
        finally:
            s.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: sum(len(a) for a in acked.values()) >= 1500, timeout=30, what="1500 acknowledged messages")
    j.kill()  # mid-stream: requests are in flight
    stop_sending.set()
    for t in threads:
        t.join(10)
    total = sum(len(a) for a in acked.values())
    assert total >= 1500

    dev = j.start()
    after = send_acked(dev.router, "after-kill", 10)
    replayed = messages(j.fetch())
    assert_consecutive(replayed)
    journaled_bodies = bodies(replayed)
    present = set(journaled_bodies)
    for n, got in acked.items():
        missing = [b for b in got if b not in present]
        assert not missing, f"client {n}: {len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        # Per client, the journal keeps the order they were sent in.
        mine = [b for b in journaled_bodies if json.loads(b).get("c") == n]
        assert mine[: len(got)] == got
    assert journaled_bodies[-10:] == after
    assert len(journaled_bodies) == len(present), "a message was journaled twice"
    assert j.stop() == 0


# -- retention ---------------------------------------------------------------------------

def test_retention_answers_gone_and_the_client_reports_the_loss(journaled):
    j = journaled(["--journal-segment-bytes", "4096", "--journal-retention-bytes", "16384",
                   "--journal-fsync-interval-ms", "20"])
    dev = j.start()
    # A small window keeps batches small, so segments stay close to their size limit.
    acked = send_acked(dev.router, "r", 1000, window=5, pad=200)
    assert len(acked) == 1000

    def size(segment: Path) -> int:
        try:
            return segment.stat().st_size
        except FileNotFoundError:  # retention deleted it between the listing and the stat (seen under load)
            return 0

    def on_disk() -> int:
        return sum(size(f) for f in (j.data_dir / "journal").glob("*.journal"))

    # Retention runs from the device's timer: it keeps the total within the limit (the
    # active segment, never deleted, could only exceed it alone).
    wait_for(lambda: on_disk() <= 16384, timeout=20, what="retention to delete the oldest segments")
    got = j.fetch()
    lost, rest = got[0], messages(got[1:])
    assert isinstance(lost, Lost)
    assert lost.first == 1 and lost.last == rest[0].meta.seq - 1 and lost.count > 0
    assert_consecutive(rest, rest[0].meta.seq)
    assert bodies(rest)[-10:] == acked[-10:]
    # A range entirely behind retention is all Lost; one straddling it is Lost then data.
    assert j.fetch(1, 5) == [Lost(1, 5)]
    first = rest[0].meta.seq
    straddle = j.fetch(first - 3, first + 1)
    assert straddle[0] == Lost(first - 3, first - 1)
    assert [m.meta.seq for m in straddle[1:]] == [first, first + 1]
    metrics = scrape(j.metrics_port)
    assert metrics[("logjam_device_journal_segments_deleted_total", ())] > 0
    assert metrics[("logjam_device_journal_first_seq", ())] == first
    assert j.stop() == 0


# -- a bad replay peer ------------------------------------------------------------------------

def test_garbage_replay_requests_do_not_hurt_the_device(journaled):
    j = journaled()
    dev = j.start()
    acked = send_acked(dev.router, "g", 20)
    ctx = zmq.Context.instance()
    bad = ctx.socket(zmq.DEALER)
    bad.linger = 0
    bad.connect(j.replay)
    garbage = [
        [b""], [b"replay"], [b"replay", b"1", b"2"], [b"replay", u64(1)], [b"REPLAY", u64(1), u64(2)],
        [REPLAY, u64(1), u64(2), b"extra"], [b"\xff" * 10_000], [REPLAY] * 50,
        [REPLAY, u64(2**64 - 1), u64(0)], [REPLAY, u64(0), u64(2**64 - 1)], [REPLAY, u64(5), u64(1)],
    ]
    for frames in garbage:
        bad.send_multipart(frames)
    # Raw bytes that are not ZMTP at all, on the replay port and a half-open connection.
    for payload in (b"GET / HTTP/1.0\r\n\r\n", b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03" * 100):
        with socket.create_connection(("127.0.0.1", j.replay_port), timeout=2) as raw:
            raw.sendall(payload)
    half = socket.create_connection(("127.0.0.1", j.replay_port), timeout=2)
    try:
        # Only the three well-formed oddities got answers: nothing from the end of u64,
        # seq 0 was never journaled, and a reversed range still gets its first message.
        answers = []
        while bad.poll(1000):
            answers.append(bad.recv_multipart()[0])
        assert answers == [b"end", b"gone", b"batch"]
        replayed = messages(j.fetch())
        assert_consecutive(replayed)
        assert bodies(replayed) == acked
        more = send_acked(dev.router, "g2", 20)
        assert bodies(messages(j.fetch()))[-20:] == more
        metrics = scrape(j.metrics_port)
        assert metrics[("logjam_device_replay_bad_requests_total", ())] >= 7
    finally:
        half.close()
        bad.close()
    assert j.stop() == 0


def test_replay_port_in_use_fails_the_start(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        proc = start([command("logjam-device"), "--bind", "127.0.0.1", "-t", str(free_port()), "-p", str(free_port()),
                      "-P", str(free_port()), "-s", str(free_port()), "--data-dir", str(tmp_path),
                      "--replay-port", str(taken.getsockname()[1]), "--allow-plaintext"])
        assert proc.wait(20) == 1
        assert "replay port" in proc.stdout.read()
    finally:
        taken.close()


def test_without_data_dir_there_is_no_journal_and_no_replay_answers(device_factory, tmp_path):
    replay_port = free_port()
    dev = device_factory(extra=["--replay-port", str(replay_port)])
    with Producer(dev.router) as p:
        assert p.request("shop-test", "logs.x", {"n": 1})
    client = ReplayClient(f"tcp://127.0.0.1:{replay_port}", timeout=0.5)
    try:
        with pytest.raises(TimeoutError):
            list(client.fetch(1, 10))
        info = client.info()  # only `info` is answered: nothing is held
        assert info.first == info.last + 1
    finally:
        client.close()
    assert stop(dev.proc) == 0
    assert not list(tmp_path.iterdir())


def test_a_torn_last_batch_is_truncated_on_start(journaled):
    j = journaled()
    dev = j.start()
    acked = send_acked(dev.router, "torn", 30)
    j.kill()
    segment = sorted((j.data_dir / "journal").glob("*.journal"))[-1]
    whole = segment.read_bytes()
    # What a crash inside the write leaves: a batch header promising more than is there.
    torn = b"\x00\x00\x10\x00" + b"\x12\x34\x56\x78" + b"\x00" * 8 + b"\x00\x00\x00\x05" + b"half a batch"
    with open(segment, "ab") as f:
        f.write(torn)
    dev = j.start()
    # Cut at the last whole batch; the start heartbeat is written right after it.
    assert segment.read_bytes()[: len(whole)] == whole
    assert segment.read_bytes()[len(whole) : len(whole) + len(torn)] != torn
    after = send_acked(dev.router, "after", 5)
    replayed = messages(j.fetch())
    assert_consecutive(replayed)
    assert bodies(replayed) == acked + after
    assert j.stop() == 0
    assert "truncating 32 bytes of a torn last batch" in dev.output()


def test_corruption_before_the_last_segment_stops_the_start(journaled):
    j = journaled(["--journal-segment-bytes", "2048"])
    dev = j.start()
    send_acked(dev.router, "c", 100, window=5, pad=100)
    assert j.stop() == 0
    segments = sorted((j.data_dir / "journal").glob("*.journal"))
    assert len(segments) > 2
    data = bytearray(segments[0].read_bytes())
    data[40] ^= 0xFF  # inside the first batch's body: its crc no longer matches
    segments[0].write_bytes(bytes(data))
    proc = start([command("logjam-device"), "--bind", "127.0.0.1", "-t", str(free_port()), "-p", str(free_port()),
                  "-P", str(free_port()), "-s", str(free_port()), "--data-dir", str(j.data_dir),
                  "--replay-port", str(free_port()), "--allow-plaintext"])
    assert proc.wait(20) == 1
    out = proc.stdout.read()
    assert "cannot start" in out and "bad batch" in out, out
