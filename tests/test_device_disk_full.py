"""A logjam-device whose journal cannot be written: it stays up, accepts nothing it cannot
journal, holds its clients, and resumes by itself when the disk has room again.

Real devices on both engines; the disk fills for real (a small tmpfs with a filler file
that is deleted to give the space back) or the process's RLIMIT_FSIZE is lowered (EFBIG)
and raised again. A real Lumberjack bridge in front shows that bridges hold their clients.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest
import zmq

from logjam.message import Message
from logjam.meta import Meta
from logjam.replay import ReplayClient
from harness.device import DeviceProcess, start_device
from tests.disk_support import fill, limit_file_size, small_tmpfs, torn_bytes
from harness.processes import free_port, stop, wait_for
from tests.test_device_helpers import dealer, meta, scrape
from tests.test_device_journal import ENGINES, EVERYTHING

pytestmark = pytest.mark.timeout(150)

T = TypeVar("T")
WRITABLE = ("logjam_device_journal_writable", ())
FAILURES = ("logjam_device_journal_write_failures_total", ())


class Sender(threading.Thread):
    """A pipelined DEALER client: what it sent and what got its 202, in order."""

    def __init__(self, router: str, tag: str, pad: int = 1000, window: int = 50) -> None:
        super().__init__(daemon=True)
        self.router, self.tag, self.pad, self.window = router, tag, pad, window
        self.sent: list[bytes] = []
        self.acked: list[bytes] = []
        self.halt = threading.Event()
        self.peer_gone = threading.Event()  # the device has exited: read what it sent, then stop waiting
        self.error: BaseException | None = None

    def run(self) -> None:
        s = dealer(self.router, zmq.Context.instance())
        try:
            deadline = None
            while len(self.acked) < len(self.sent) or not self.halt.is_set():
                if self.halt.is_set():
                    deadline = deadline or time.monotonic() + 60
                    if time.monotonic() > deadline:
                        return
                if self.peer_gone.is_set() and not s.poll(500):
                    return
                while not self.halt.is_set() and len(self.sent) - len(self.acked) < self.window:
                    body = json.dumps({"tag": self.tag, "i": len(self.sent), "pad": "x" * self.pad}).encode()
                    s.send_multipart([b"", b"shop-test", b"logs.full", body, meta()])
                    self.sent.append(body)
                if s.poll(200):
                    reply = s.recv_multipart()
                    assert reply == [b"shop-test", b"202 Accepted"], reply
                    self.acked.append(self.sent[len(self.acked)])
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            s.close()

    def finish(self) -> None:
        self.halt.set()
        self.join(90)
        assert self.error is None, self.error
        assert not self.is_alive()


class Published(threading.Thread):
    """A subscriber (joined: its first message is the device's heartbeat) keeping what it saw."""

    def __init__(self, pub: str) -> None:
        super().__init__(daemon=True)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.rcvhwm = 0
        self.sub.subscribe(b"")
        self.sub.connect(pub)
        assert self.sub.poll(20_000) and self.sub.recv_multipart()[0] == b"heartbeat"
        self.bodies: list[bytes] = []
        self.seqs: dict[bytes, int] = {}
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            if self.sub.poll(100):
                frames = self.sub.recv_multipart()
                if frames[0] == b"shop-test":
                    self.bodies.append(frames[2])
                    self.seqs[frames[2]] = Meta.unpack(frames[3]).seq

    def close(self) -> None:
        self.done.set()
        self.join(5)
        self.sub.close()


def settled(get: Callable[[], T], quiet: float = 1.5, timeout: float = 30) -> T:
    """The value of `get()` once it stopped changing for `quiet` seconds."""
    value, since = get(), time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "never settled"
        time.sleep(0.1)
        now = get()
        if now != value:
            value, since = now, time.monotonic()
    return value


def start_journaled(data_dir: Path, engine: str, *flags: str) -> tuple[DeviceProcess, str, int]:
    replay, metrics = free_port(), free_port()
    dev = start_device(native=engine, extra=["--data-dir", str(data_dir), "--replay-port", str(replay),
                                             "--metrics-port", str(metrics), *flags])
    return dev, f"tcp://127.0.0.1:{replay}", metrics


def journaled(replay: str) -> list[Message]:
    client = ReplayClient(replay, timeout=10)
    try:
        got = list(client.fetch(1, EVERYTHING))
    finally:
        client.close()
    assert all(isinstance(m, Message) for m in got)
    assert [m.meta.seq for m in got] == list(range(1, len(got) + 1)), "journal seqs are not consecutive"
    return got  # type: ignore[return-value]


def whole_batches_only(journal_dir: Path) -> None:
    """No torn bytes on disk: every segment ends with a whole batch."""
    assert torn_bytes(journal_dir) == {}, "torn bytes per segment"


def stats_health(stats: str) -> dict:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.subscribe(b"stats")
    sub.connect(stats)
    try:
        assert sub.poll(5000), "no stats within 5 s"
        return json.loads(sub.recv_multipart()[3])
    finally:
        sub.close()


def assert_holding(dev: DeviceProcess, sender: Sender, published: Published, metrics: int, journal_dir: Path) -> None:
    """While the journal cannot be written: nothing new is acknowledged or published."""
    wait_for(lambda: scrape(metrics)[WRITABLE] == 0, timeout=60, what="the journal to be full")
    acked = settled(lambda: len(sender.acked))
    seen = settled(lambda: len(published.bodies))
    assert len(sender.sent) > acked, "the client should have requests waiting"
    # Everything published was acknowledged and everything acknowledged was published: the
    # held batch is neither.
    assert set(published.bodies) == set(sender.acked[:acked]) and seen == acked
    before = scrape(metrics)[FAILURES]
    wait_for(lambda: scrape(metrics)[FAILURES] >= before + 2, timeout=10, what="retries about once a second")
    assert scrape(metrics)[("logjam_device_journal_held_messages", ())] > 0
    health = stats_health(dev.stats)
    assert health["journal_writable"] is False and health["held_messages"] > 0 and health["journal_write_failures"] >= 1
    whole_batches_only(journal_dir)
    assert len(sender.acked) == acked and dev.proc.poll() is None


def assert_resumed(dev: DeviceProcess, sender: Sender, published: Published, metrics: int, replay: str) -> None:
    wait_for(lambda: scrape(metrics)[WRITABLE] == 1, timeout=30, what="the device to resume")
    more = len(sender.acked)
    wait_for(lambda: len(sender.acked) > more + 100, timeout=30, what="acknowledgements after the resume")
    sender.finish()
    assert sender.acked == sender.sent
    wait_for(lambda: len(published.bodies) == len(sender.acked), timeout=30, what="every message published")
    published.close()
    assert published.bodies == sender.acked
    bodies = [m.body for m in journaled(replay) if m.app_env == "shop-test"]
    assert bodies == sender.acked, "every acknowledged message journaled once, in order"
    assert stop(dev.proc) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_full_tmpfs_holds_then_resumes_when_space_returns(tmp_path, engine):
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        dev, replay, metrics = start_journaled(disk / "data", engine, "--journal-fsync", "always")
        published = Published(dev.pub)
        sender = Sender(dev.router, "full")
        try:
            filler = fill(disk, leave=600 * 1024)
            sender.start()
            assert_holding(dev, sender, published, metrics, disk / "data" / "journal")
            filler.unlink()  # the space comes back; nothing else is done to the device
            assert_resumed(dev, sender, published, metrics, replay)
        finally:
            sender.halt.set()
            published.done.set()
            stop(dev.proc)
        out = dev.output()
    stopped = [line for line in out.splitlines() if "journal write failed" in line]
    assert len(stopped) == 1, out[-3000:]
    assert "journal write failed: [Errno 28] No space left on device (" in stopped[0]
    assert stopped[0].endswith("; not accepting until it can write")
    assert out.count("journal writable again after") == 1
    assert "Traceback" not in out


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_size_limit_holds_then_resumes_when_raised(tmp_path, engine):
    dev, replay, metrics = start_journaled(tmp_path / "data", engine)
    published = Published(dev.pub)
    sender = Sender(dev.router, "fsize")
    try:
        segment = next((tmp_path / "data" / "journal").glob("*.journal"))
        limit_file_size(dev.proc.pid, segment.stat().st_size + 300 * 1024)
        sender.start()
        assert_holding(dev, sender, published, metrics, tmp_path / "data" / "journal")
        limit_file_size(dev.proc.pid, None)
        assert_resumed(dev, sender, published, metrics, replay)
    finally:
        sender.halt.set()
        published.done.set()
        stop(dev.proc)
    out = dev.output()
    assert out.count("journal write failed: [Errno 27] File too large (") == 1, out[-3000:]
    assert out.count("journal writable again after") == 1


def test_sigterm_while_holding_exits_0_and_nothing_acknowledged_is_lost(tmp_path):
    dev, replay, metrics = start_journaled(tmp_path / "data", "require")
    sender = Sender(dev.router, "term")
    published = Published(dev.pub)
    try:
        segment = next((tmp_path / "data" / "journal").glob("*.journal"))
        limit_file_size(dev.proc.pid, segment.stat().st_size + 100 * 1024)
        sender.start()
        assert_holding(dev, sender, published, metrics, tmp_path / "data" / "journal")
        acked = list(sender.acked)
        assert stop(dev.proc) == 0
        sender.halt.set()
        sender.peer_gone.set()
        sender.join(90)
        assert not sender.is_alive() and sender.error is None, sender.error
    finally:
        sender.halt.set()
        published.close()
        stop(dev.proc)
    out = dev.output()
    assert "stopping with" in out and "never published nor acknowledged" in out, out[-2000:]
    assert sender.acked == acked  # nothing more was acknowledged on the way out
    dev, replay, _ = start_journaled(tmp_path / "data", "require")
    try:
        bodies = [m.body for m in journaled(replay) if m.app_env == "shop-test"]
        assert bodies == acked
        assert stop(dev.proc) == 0
    finally:
        stop(dev.proc)
    assert "truncating" not in dev.output()  # the failed write left no torn tail


def test_a_lumberjack_client_is_held_through_the_bridge_until_the_device_can_write(tmp_path):
    """pylogbeat through a real bridge: no ack and no disconnect while the device's disk is full."""
    import pylogbeat

    from tests.bridge_support import stop_bridge
    from tests.lumberjack_support import start_lumberjack

    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        dev, replay, metrics = start_journaled(disk / "data", "require")
        bridge = start_lumberjack(dev.router)
        batches: list[int] = []  # the last event number of every window pylogbeat saw acknowledged
        failed: list[BaseException] = []
        halt = threading.Event()

        def beats() -> None:
            # A socket timeout of 3 s: only the bridge's keepalives (every 0.5 s) keep it waiting longer.
            client = pylogbeat.PyLogBeatClient("127.0.0.1", bridge.port, timeout=3)
            pad = "x" * 1000
            try:
                with client:
                    n = 0
                    while not halt.is_set():
                        client.send([{"message": f"beat {n + i}", "pad": pad} for i in range(50)])
                        n += 50
                        batches.append(n)
            except BaseException as e:
                failed.append(e)

        sender = threading.Thread(target=beats, daemon=True)
        try:
            filler = fill(disk, leave=600 * 1024)
            sender.start()
            wait_for(lambda: scrape(metrics)[WRITABLE] == 0, timeout=60, what="the journal to be full")
            held_at = settled(lambda: len(batches))
            # Three times pylogbeat's socket timeout without an ack: still connected, still waiting.
            time.sleep(10)
            assert not failed, failed
            assert len(batches) == held_at and sender.is_alive()
            filler.unlink()
            wait_for(lambda: len(batches) > held_at + 5, timeout=60, what="windows acknowledged after the resume")
            halt.set()
            sender.join(60)
            assert not failed, failed
            acked = batches[-1]
            events = [m for m in journaled(replay) if m.app_env == bridge.app_env]
            lines = [m.json()["message"] for m in events]
            assert lines[:acked] == [f"beat {i}" for i in range(acked)]
            assert len(lines) == acked, "every window journaled once (no resend: the connection held)"
            out = stop_bridge(bridge)
            assert stop(dev.proc) == 0
        finally:
            halt.set()
            stop(bridge.proc)
            stop(dev.proc)
    assert "lost connection" not in out and "resending" not in out
    assert dev.output().count("journal write failed: [Errno 28] No space left on device") == 1
