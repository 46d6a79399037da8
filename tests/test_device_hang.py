"""A hung device costs at most its share: DeviceLink against two real devices, one of them SIGSTOPped.

A stopped device keeps its connection, so only its silence shows the hang: after
--device-deadline without a reply while it owes some, it gets no new batches. Each
connection's batches stay on its home device (`DeviceLink.affinity()`), so only the
connections homed on the hung device wait; their new batches, and every new connection,
go to the other device. What the hung device holds waits for it and is answered once
it continues, once.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import pytest

from bridges.host.link import DeviceLink
from logjam import Message
from logjam.subscriber import Subscriber
from harness.device import start_device
from harness.processes import stop, wait_for
from tests.test_device_link import _subscribe

pytestmark = pytest.mark.timeout(90)

DEADLINE = 1.0


def _messages(tag: str, n: int, start: int = 0) -> list[Message]:
    return [Message.build("link-test", "logs.test", {"i": f"{tag}{i}"}) for i in range(start, start + n)]


def _drain(subs: list[Subscriber], got: collections.Counter, want: int, timeout: float = 20) -> None:
    def enough() -> bool:
        for sub in subs:
            for m in sub.recv_batch(timeout=0.05):
                if isinstance(m, Message) and m.app_env == "link-test":
                    got[m.json()["i"]] += 1
        return sum(got.values()) >= want

    wait_for(enough, timeout=timeout, what=f"{want} messages at the subscribers")


@pytest.fixture
def two_devices():
    devs = [start_device(1), start_device(2)]
    yield devs
    for d in devs:
        os.kill(d.proc.pid, signal.SIGCONT)
    for d in devs:
        assert stop(d.proc) == 0, d.output()


def test_a_hung_device_stalls_only_the_connections_homed_on_it(two_devices):
    a, b = two_devices
    subs = [_subscribe(a), _subscribe(b)]
    reroutes: list[str] = []

    async def run() -> dict:
        link = DeviceLink([a.router, b.router], deadline=DEADLINE, on_reroute=reroutes.append)
        link.start()
        await asyncio.wait_for(_until(lambda: all(link.connected.values())), 10)
        # Two connections: one homed on each device (the one with fewer homes is chosen).
        first, second = link.affinity(), link.affinity()
        homes = {first.home.endpoint, second.home.endpoint}
        assert homes == {a.router, b.router}
        on_a, on_b = (first, second) if first.home.endpoint == a.router else (second, first)
        third = link.affinity()
        assert len(third.home.homes) == 2
        third.release()  # a connection that ended counts no more, though the object lives on
        assert len(third.home.homes) == 1
        await link.publish(_messages("warm", 10), on_a)
        await link.publish(_messages("warm", 10, 10), on_b)
        assert reroutes == []

        os.kill(a.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        stuck = asyncio.create_task(link.publish(_messages("stuck", 30), on_a))
        # The connection homed on the healthy device never waits, during the deadline or after it.
        for k in range(10):
            await asyncio.wait_for(link.publish(_messages(f"b{k}-", 20), on_b), 2)
        assert not stuck.done()
        await asyncio.wait_for(_until(lambda: a.router in link.hung), DEADLINE + 3)
        assert DEADLINE <= time.monotonic() - t0
        # Once hung: the stalled connection's new batches go to the other device (counted), and a
        # new connection is homed there.
        await asyncio.wait_for(link.publish(_messages("moved", 20), on_a), 2)
        assert reroutes == ["hung"]
        late = link.affinity()
        assert late.home.endpoint == b.router
        await asyncio.wait_for(link.publish(_messages("late", 20), late), 2)
        # Calls without a connection go round-robin; the hung device's turns go to the other (counted).
        for k in range(4):
            await asyncio.wait_for(link.publish(_messages(f"free{k}-", 5)), 2)
        assert reroutes.count("hung") == 3
        assert not stuck.done()

        os.kill(a.proc.pid, signal.SIGCONT)
        await asyncio.wait_for(stuck, 20)
        await asyncio.wait_for(_until(lambda: not link.hung), 5)
        # It answers again: the connection's batches go home again.
        await asyncio.wait_for(link.publish(_messages("home", 10), on_a), 5)
        assert reroutes.count("hung") == 3
        resets = link.resets
        await link.close()
        return {"resets": resets}

    out = asyncio.run(run())
    assert out["resets"] == 0
    got: collections.Counter = collections.Counter()
    want = 20 + 30 + 200 + 20 + 20 + 20 + 10
    _drain(subs, got, want)
    time.sleep(0.5)
    _drain(subs, got, want, timeout=1)
    assert len(got) == want and set(got.values()) == {1}, [k for k, n in got.items() if n != 1][:5]
    for sub in subs:
        sub.close()


def test_what_waits_on_a_hung_device_leaves_the_inflight_bound_to_the_others(two_devices):
    """--max-inflight is process-wide: the hung device's share of it is given to the others."""
    a, b = two_devices

    async def run() -> None:
        link = DeviceLink([a.router, b.router], max_inflight=100, deadline=DEADLINE)
        link.start()
        await asyncio.wait_for(_until(lambda: all(link.connected.values())), 10)
        first, second = link.affinity(), link.affinity()
        on_a, on_b = (first, second) if first.home.endpoint == a.router else (second, first)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            stuck = asyncio.create_task(link.publish(_messages("s", 100), on_a))
            await asyncio.sleep(0.1)
            assert link.inflight == 100
            waiting = asyncio.create_task(link.publish(_messages("w", 50), on_b))
            done, _ = await asyncio.wait({waiting}, timeout=DEADLINE / 2)
            assert not done, "the bound was full: the call should wait"
            await asyncio.wait_for(waiting, DEADLINE + 3)  # a is hung: its 100 no longer count
            assert a.router in link.hung and link.inflight == 0
            await asyncio.wait_for(link.publish(_messages("x", 100), on_b), 2)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        await asyncio.wait_for(stuck, 20)
        assert link.inflight == 0 and not link.hung
        await link.close()

    asyncio.run(run())


def test_an_idle_device_is_pinged_so_its_hang_is_seen_before_anything_waits_on_it(two_devices):
    """A device the bridge owes nothing is asked on a ping socket: stopped while idle, it is hung
    before the first call would have gone to it, and no call waits on it."""
    a, b = two_devices
    reroutes: list[str] = []

    async def run() -> None:
        link = DeviceLink([a.router, b.router], deadline=DEADLINE, on_reroute=reroutes.append)
        link.start()
        await asyncio.wait_for(_until(lambda: all(link.connected.values())), 10)
        await asyncio.sleep(DEADLINE * 2)  # idle, answering its pings: not hung
        assert not link.hung
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(_until(lambda: a.router in link.hung), DEADLINE * 2 + 2)
            assert link.affinity().home.endpoint == b.router
            for k in range(4):
                await asyncio.wait_for(link.publish(_messages(f"i{k}-", 5)), 2)
            assert reroutes == ["hung", "hung"]
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        await asyncio.wait_for(_until(lambda: not link.hung), 3)
        await link.close()

    asyncio.run(run())


def test_one_device_hung_is_still_waited_for(device):
    """With no other device, calls still go to the hung one: it is all there is."""
    reroutes: list[str] = []

    async def run() -> None:
        link = DeviceLink([device.router], deadline=DEADLINE, on_reroute=reroutes.append)
        link.start()
        await asyncio.wait_for(_until(lambda: all(link.connected.values())), 10)
        home = link.affinity()
        os.kill(device.proc.pid, signal.SIGSTOP)
        try:
            first = asyncio.create_task(link.publish(_messages("x", 5), home))
            await asyncio.wait_for(_until(lambda: device.router in link.hung), DEADLINE + 3)
            second = asyncio.create_task(link.publish(_messages("y", 5), home))
            await asyncio.sleep(0.2)
            assert not first.done() and not second.done()
            # With no device answering, what waits on it still counts against --max-inflight.
            assert link.inflight == 10
        finally:
            os.kill(device.proc.pid, signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(first, second), 20)
        assert not link.hung
        await link.close()

    asyncio.run(run())
    assert reroutes == []


def test_device_deadline_must_be_positive():
    with pytest.raises(ValueError):
        DeviceLink(["tcp://127.0.0.1:1"], deadline=0)


async def _until(cond, interval: float = 0.02) -> None:
    while not cond():
        await asyncio.sleep(interval)
