"""Producer and Subscriber over real ZeroMQ sockets on 127.0.0.1.

The peer here is a minimal ROUTER/PUB written in the test; the real device has
its own tests. What is under test is the client and consumer ends.
"""

from __future__ import annotations

import threading

import pytest
import zmq

from logjam import Message, Meta
from logjam.meta import Compression
from logjam.producer import Producer, ReplyTimeout
from logjam.subscriber import Gap, Subscriber
from harness.processes import free_port, wait_for

pytestmark = pytest.mark.timeout(30)


class Responder(threading.Thread):
    """A ROUTER that answers like a device: 202 for logs topics, 400 otherwise, pong for ping."""

    def __init__(self, ctx: zmq.Context, port: int, silent: bool = False) -> None:
        super().__init__(daemon=True)
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.silent = silent
        self.received: list[list[bytes]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            self.received.append(frames)
            if self.silent:
                continue
            rid, rest = frames[0], frames[1:]
            if rest[0] == b"" and rest[1] == b"ping":
                self.sock.send_multipart([rid, b"ping", b"200 OK", b"device.example"])
            elif rest[0] == b"":
                ok = rest[2].startswith(b"logs")
                self.sock.send_multipart([rid, rest[1], b"202 Accepted" if ok else b"400 Bad Request"])
        self.sock.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_dealer_ping_returns_fqdn(ctx):
    port = free_port()
    r = Responder(ctx, port)
    r.start()
    with Producer(f"tcp://127.0.0.1:{port}", context=ctx) as p:
        assert p.ping() == "device.example"
    r.stop()


def test_pipelined_requests_count_202_and_400(ctx):
    port = free_port()
    r = Responder(ctx, port)
    r.start()
    with Producer(f"tcp://127.0.0.1:{port}", context=ctx) as p:
        for i in range(500):
            p.submit("app-test", "logs.a" if i % 5 else "bogus", {"i": i})
        result = p.flush()
        assert (result.accepted, result.rejected) == (400, 100)
        assert p.request("app-test", "logs", b"{}") is True
        assert p.request("app-test", "nope", b"{}") is False
    r.stop()
    data = [f for f in r.received if f[2] != b"ping"]
    seqs = [Meta.unpack(f[5]).seq for f in data]
    assert seqs == list(range(1, 503))
    assert all(f[1] == b"" and len(f) == 6 for f in data)


def test_request_times_out(ctx):
    port = free_port()
    r = Responder(ctx, port, silent=True)
    r.start()
    p = Producer(f"tcp://127.0.0.1:{port}", context=ctx, timeout=0.3)
    p.submit("app-test", "logs", b"{}")
    with pytest.raises(ReplyTimeout, match="1 requests unanswered"):
        p.flush()
    with pytest.raises(ReplyTimeout):
        p.ping()
    p.close()
    r.stop()


def test_push_mode_is_fire_and_forget_and_compresses(ctx):
    port = free_port()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(f"tcp://127.0.0.1:{port}")
    with Producer(f"tcp://127.0.0.1:{port}", mode="push", compression="lz4", context=ctx) as p:
        p.send("app-test", "logs", {"hello": "world"}, created_ms=1234)
        with pytest.raises(ValueError, match="DEALER"):
            p.ping()
    assert pull.poll(5000)
    msg = Message.from_frames(pull.recv_multipart())
    assert msg.meta.compression == Compression.LZ4 and msg.meta.created_ms == 1234 and msg.meta.seq == 1
    assert msg.json() == {"hello": "world"}
    pull.close()


def test_sequence_wraps_to_one(ctx):
    port = free_port()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(f"tcp://127.0.0.1:{port}")
    p = Producer(f"tcp://127.0.0.1:{port}", mode="push", context=ctx)
    p._seq = 2**63 - 2
    assert [p.send("a-b", "logs", b"{}") for _ in range(3)] == [2**63 - 1, 1, 2]
    p.close()
    pull.close()


def _publish(pub: zmq.Socket, app_env: str, device: int, seq: int, body: bytes = b"{}") -> None:
    pub.send_multipart(Message(app_env, "logs", body, Meta(0, device, 1, seq)).to_frames())


def _bound_pub(ctx) -> tuple[zmq.Socket, str]:
    port = free_port()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    return pub, f"tcp://127.0.0.1:{port}"


def _wait_subscribed(pub, sub) -> Message:
    def probe():
        _publish(pub, "heartbeat", 3, 0)
        return sub.recv(timeout=0.05)

    return wait_for(probe, what="subscription to take effect")


def _is_probe(event) -> bool:
    # _wait_subscribed may send several probes before the first arrives; the rest trail in later.
    return isinstance(event, Message) and event.is_heartbeat and event.meta.device == 3 and event.meta.seq == 0


def _collect(sub, n: int) -> list:
    """The next `n` events that are not _wait_subscribed's probes."""
    events: list = []

    def more() -> bool:
        events.extend(e for e in sub.recv_batch(timeout=0.05) if not _is_probe(e))
        return len(events) >= n

    wait_for(more, what=f"{n} events")
    return events


def test_subscriber_filters_by_app_env_prefix(ctx):
    pub, ep = _bound_pub(ctx)
    sub = Subscriber([ep], ["shop-"], context=ctx)
    first = _wait_subscribed(pub, sub)
    assert isinstance(first, Message) and first.is_heartbeat
    _publish(pub, "other-prod", 3, 1)
    _publish(pub, "shop-prod", 3, 2, b'{"a":1}')
    _publish(pub, "heartbeat", 3, 3)
    events = _collect(sub, 2)
    assert [(e.app_env, e.meta.seq) for e in events] == [("shop-prod", 2), ("heartbeat", 3)]
    assert events[0].json() == {"a": 1}
    # A prefix subscription sees other streams' numbers as holes, so it tracks no gaps.
    assert sub.gaps is None
    sub.close()
    pub.close()


def test_subscriber_tracks_gaps_per_device(ctx):
    pub, ep = _bound_pub(ctx)
    sub = Subscriber(ep, context=ctx)
    _wait_subscribed(pub, sub)
    _publish(pub, "shop-prod", 4, 2)
    _publish(pub, "shop-prod", 4, 6)  # 3, 4, 5 lost
    _publish(pub, "shop-prod", 4, 1)  # restart
    _publish(pub, "shop-prod", 0, 99)  # device 0 is not tracked
    pub.send_multipart([b"shop-x", b"logs", b"{}", b"short meta"])
    _publish(pub, "shop-prod", 0, 5)
    events = _collect(sub, 7)
    kinds = [(type(e).__name__, e.meta.seq if isinstance(e, Message) else e.lost) for e in events]
    assert kinds == [("Message", 2), ("Gap", 3), ("Message", 6), ("Gap", -6), ("Message", 1), ("Message", 99), ("Message", 5)]
    assert events[1] == Gap(4, 3, 3, 5)
    assert events[3].restart
    assert sub.gaps.lost == {4: 3}
    assert sub.bad_messages == 1
    sub.close()
    pub.close()


def test_subscriber_reconnects_after_silence(ctx):
    port = free_port()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    sub = Subscriber(f"tcp://127.0.0.1:{port}", context=ctx, heartbeat_interval=0.05)
    wait_for(lambda: sub.recv(timeout=0.02) is None and sub.reconnects >= 1, timeout=5, what="a reconnect")
    # Still receives after reconnecting.
    wait_for(lambda: (_publish(pub, "a-b", 1, 1), sub.recv(timeout=0.05))[1], what="traffic after reconnect")
    sub.close()
    pub.close()
