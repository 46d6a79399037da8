"""The C fast path (devices.native) against the wire library's rules, over real inproc sockets.

Arbitrary multipart messages go through a real PUSH/PULL pair into `lj_drain`; what
it accepts, drops (and why), numbers and publishes must match `Meta.unpack` and
`logjam.validation` exactly.
"""

from __future__ import annotations

import itertools

import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from devices import native
from logjam.meta import Meta
from harness.native import c_module
from tests.test_device_helpers import classify, meta

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def loaded() -> tuple:
    """The C loop (skipped under LOGJAM_NATIVE=off; under require a missing build fails)."""
    return c_module(native.MODULE)

_ids = itertools.count()


class Pipe:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        name = f"inproc://native-{next(_ids)}"
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.sndhwm = 0
        self.push.bind(name)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.rcvhwm = 0
        self.pull.connect(name)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(name + "-out")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.subscribe(b"")
        self.sub.connect(name + "-out")
        self.batch = native.NativeBatch(*native.load())
        self.handle = native.load()[0].cast("void *", self.pull.underlying)

    def close(self) -> None:
        self.batch.discard()
        for s in (self.push, self.pull, self.pub, self.sub):
            s.close(linger=0)
        self.ctx.term()


@pytest.fixture(scope="module")
def pipe():
    p = Pipe()
    yield p
    p.close()


frame = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"a-b", b"shop-production", b"nodash", b"", b"logs", b"logs.x", b"events", b"frontend.ajax",
                     b"front", b"mobile", meta(), meta(tag=0xBDCA), meta(version=2), meta(compression=4), meta()[:23]]),
)
message = st.lists(frame, min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(message, min_size=1, max_size=20))
def test_drain_accepts_and_drops_exactly_like_the_library(pipe, messages):
    for m in messages:
        pipe.push.send_multipart(m)
    expected = [classify(m) for m in messages]
    taken = 0
    drops: list[tuple[str, bytes]] = []
    accepted: list[list[bytes]] = []
    while taken < len(messages):
        n = pipe.batch.drain(pipe.handle, 1024)
        assert n >= 0
        taken += n
        drops += pipe.batch.drops()
        accepted += [[pipe.batch.frame(i, k) for k in range(4)] for i in range(len(pipe.batch))]
        pipe.batch.discard()
    assert taken == len(messages)
    assert [r for r in expected if r] == [r for r, _ in drops]
    assert [m[0][:255] for m, r in zip(messages, expected) if r] == [app for _, app in drops]
    good = [m for m, r in zip(messages, expected) if r is None]
    assert [a[:3] for a in accepted] == [g[:3] for g in good]
    for a, g in zip(accepted, good):
        if len(g) == 4:
            assert a[3] == g[3]
        else:
            assert Meta.unpack(a[3]) == Meta(0, 0, 0, 0)


def test_number_and_publish(pipe):
    msgs = [
        [b"a-b", b"logs", b"one", meta(created_ms=5, seq=100, compression=1, device=9)],
        [b"a-b", b"logs", b"two", meta(created_ms=0, tag=0xBDCA)],
        [b"c-d", b"events", b"three"],
    ]
    for m in msgs:
        pipe.push.send_multipart(m)
    got = 0
    while got < 3:
        got += pipe.batch.drain(pipe.handle, 1024)
        if len(pipe.batch) == 3:
            break
    assert len(pipe.batch) == 3
    assert sorted(pipe.batch.app_env_counts()) == [(b"a-b", 2), (b"c-d", 1)]
    assert pipe.batch.number(0xFFFFFFFE, 2**63, 1_234) == 3
    pipe.batch.publish(pipe.pub)
    out = [pipe.sub.recv_multipart() for _ in range(3)]
    assert [o[:3] for o in out] == [m[:3] for m in msgs]
    metas = [Meta.unpack(o[3]) for o in out]
    assert [(x.device, x.seq) for x in metas] == [(0xFFFFFFFE, 2**63 + i) for i in range(3)]
    assert [x.created_ms for x in metas] == [5, 1_234, 1_234]
    assert [x.compression for x in metas] == [1, 0, 0]
    assert all(o[3][:2] == b"\xca\xbd" for o in out)


def test_many_distinct_app_envs_overflow_the_tally(pipe):
    for i in range(100):
        pipe.push.send_multipart([b"app%d-prod" % i, b"logs", b"{}", meta()])
    counts: dict[bytes, int] = {}
    taken = 0
    while taken < 100:
        taken += pipe.batch.drain(pipe.handle, 1024)
        for app, n in pipe.batch.app_env_counts():
            counts[app] = counts.get(app, 0) + n
        pipe.batch.discard()
    assert counts == {b"app%d-prod" % i: 1 for i in range(100)}


class RouterPipe(Pipe):
    def __init__(self) -> None:
        super().__init__()
        name = f"inproc://native-router-{next(_ids)}"
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(name)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(name)
        self.rhandle = native.load()[0].cast("void *", self.router.underlying)

    def close(self) -> None:
        self.router.close(linger=0)
        self.dealer.close(linger=0)
        super().close()


@pytest.fixture(scope="module")
def rpipe():
    p = RouterPipe()
    yield p
    p.close()


def router_reason(frames: list[bytes]) -> str | None:
    return "frame_count" if len(frames) != 4 else classify(frames)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(message.filter(lambda m: m[0] != b"ping"), min_size=1, max_size=20))
def test_router_requests_get_truthful_replies_in_order(rpipe, messages):
    for m in messages:
        rpipe.dealer.send_multipart([b""] + m)
    taken = 0
    accepted: list[bytes] = []
    while taken < len(messages):
        n = rpipe.batch.drain_router(rpipe.rhandle, 1024)
        assert n >= 0
        taken += n
        accepted += [rpipe.batch.frame(i, 2) for i in range(len(rpipe.batch))]
        rpipe.batch.lib.lj_number(rpipe.batch.b, 1, 1, 1)
        rpipe.batch.publish(rpipe.pub)
        rpipe.batch.reply(rpipe.rhandle, b"host.example")
    replies = [rpipe.dealer.recv_multipart() for _ in messages]
    expected = [router_reason(m) for m in messages]
    assert replies == [[m[0], b"202 Accepted" if r is None else b"400 Bad Request"] for m, r in zip(messages, expected)]
    assert accepted == [m[2] for m, r in zip(messages, expected) if r is None]
    while rpipe.sub.poll(0):
        rpipe.sub.recv_multipart()


def test_router_ping(rpipe):
    rpipe.dealer.send_multipart([b"", b"ping", b"a-b", b"{}", meta()])
    rpipe.dealer.send_multipart([b"", b"ping", b"a-b", b"{}", b"bad"])
    taken = 0
    while taken < 2:
        taken += rpipe.batch.drain_router(rpipe.rhandle, 1024)
        assert len(rpipe.batch) == 0
        rpipe.batch.reply(rpipe.rhandle, b"host.example")
    assert rpipe.dealer.recv_multipart() == [b"ping", b"200 OK", b"host.example"]
    assert rpipe.dealer.recv_multipart() == [b"ping", b"400 Bad Request"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from([b"a-b", b"shop-production", b"x" * 200 + b"-y"]),
                          st.sampled_from([b"logs", b"events.x" + b"t" * 200]),
                          st.one_of(st.binary(max_size=100), st.sampled_from([b"", b"z" * 100_000, bytes(range(256)) * 1200]))),
                min_size=1, max_size=12))
def test_encode_is_the_journal_record_format(pipe, tmp_path_factory, messages):
    """lj_encode (growing its buffer past 256 KiB when needed) writes what Journal.append writes."""
    from devices.journal import Journal

    for app, topic, body in messages:
        pipe.push.send_multipart([app, topic, body, meta(created_ms=7)])
    while len(pipe.batch) < len(messages):
        assert pipe.batch.drain(pipe.handle, 1024) > 0
    pipe.batch.number(3, 1, 99)
    numbered = [tuple(pipe.batch.frame(i, k) for k in range(4)) for i in range(len(messages))]
    d = tmp_path_factory.mktemp("enc")
    ja, jb = Journal(d / "c"), Journal(d / "py")
    pipe.batch.journal(ja, 1)
    jb.append(1, numbered)
    assert ja.read(1, 100, 2**30) == numbered
    ja.close()
    jb.close()
    a, b = (next((d / n).glob("*.journal")).read_bytes() for n in ("c", "py"))
    assert a == b
    pipe.batch.discard()
