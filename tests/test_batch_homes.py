"""A resend after a bridge restart reaches the device that has the first copy (bridges/host/homes.py).

With two devices, a restarted bridge homes its first new connection on the first device.
A client whose connection died resends what was unacknowledged; when that went to the
second device, the resend must go there too, or two importers land the two copies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from bridges.host.homes import BatchHomes, client_key, device_tag
from bridges.host.link import DeviceLink
from bridges.lumberjack.engine import LumberjackClient
from logjam.message import Message
from tests.bridge_support import ours, ready_subscriber, start_bridge
from harness.device import start_device
from harness.courier_client import TestCourierClient
from harness.processes import free_port, stop, wait_for

pytestmark = pytest.mark.timeout(120)


def test_the_ring_survives_a_reopen_and_forgets_the_oldest(tmp_path):
    path = tmp_path / "homes"
    homes = BatchHomes(path, slots=4)
    for k in range(6):
        homes.remember(f"k{k}".encode(), 100 + k)
    assert [homes.home_of(f"k{k}".encode()) for k in range(6)] == [None, None, 102, 103, 104, 105]
    homes.remember(b"k5", 7)  # sent again elsewhere: the newest place wins
    homes.close()  # what a SIGKILL leaves is the same file: pwrite needs no close to be read back
    again = BatchHomes(path, slots=4)
    assert [again.home_of(f"k{k}".encode()) for k in range(6)] == [None, None, None, 103, 104, 7]
    again.remember(b"k6", 9)  # the stamps go on from the newest read back
    assert again.home_of(b"k3") is None and again.home_of(b"k6") == 9
    again.close()
    # A file of another size (another number of slots, a torn create) is started afresh, not misread.
    path.write_bytes(b"\x01" * 10)
    fresh = BatchHomes(path, slots=4)
    assert len(fresh) == 0 and path.stat().st_size == 4 * 24
    fresh.close()


def test_client_key_is_only_the_clients_own_id():
    assert client_key(b'{"@metadata":{"_id":"abc"},"message":"x"}') == b"abc"
    assert client_key(memoryview(b'{"message":"x","@metadata":{"_id":"k-1"}}')) == b"k-1"
    for doc in (b'{"message":"x"}', b'{"@metadata":{"_id":7}}', b'{"@metadata":{"_id":""}}',
                b'{"_id":"top-level"}', b'["_id"]', b'{"_id": not json'):
        assert client_key(doc) is None, doc


@pytest.fixture
def two_devices():
    devs = [start_device(1), start_device(2)]
    yield devs
    for d in devs:
        assert stop(d.proc) == 0, d.output()


def _bridge(protocol: str, devs, homes: Path, app_env: str, *, linked: bool):
    """The bridge; with `linked`, once /healthz says it is connected to both devices (else a new
    connection could only be homed on the one it is connected to)."""
    metrics = free_port()
    bridge = start_bridge(protocol, ",".join(d.router for d in devs), "--homes-file", str(homes),
                          "--metrics-port", str(metrics), app_env=app_env)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    if linked:
        wait_for(healthy, timeout=20, what="the bridge connected to both devices")
    return bridge


def _lumberjack_window(port: int, events: list[bytes]) -> socket.socket:
    """A new connection that sends one window and waits for its whole ack."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    client = LumberjackClient(restart_each_window=True)
    sock.sendall(client.send(events))
    acked = 0
    while acked < len(events):
        data = sock.recv(4096)
        assert data, "the bridge closed the connection"
        acked = max([acked, *(a.seq for a in client.feed(data))])
    return sock


def _device_of(subs, app_env: str, n: int) -> list[int]:
    """Which device (0 or 1) published each of the next n messages of `app_env`."""
    got: list[int] = []

    def enough() -> bool:
        for k, sub in enumerate(subs):
            got.extend(k for m in sub.recv_batch(timeout=0.05) if ours(m, app_env))
        return len(got) >= n

    wait_for(enough, timeout=30, what=f"{n} messages of {app_env}")
    return got


@pytest.fixture
def bridges():
    """The bridges a test starts; whatever it left running is killed after it."""
    started: list = []
    yield started
    for bridge in started:
        if bridge.proc.poll() is None:
            bridge.proc.kill()
            bridge.proc.wait(10)


@pytest.mark.parametrize("protocol", ["lumberjack", "courier"])
def test_a_resend_after_a_bridge_sigkill_goes_to_the_device_of_the_first_copy(two_devices, bridges, tmp_path,
                                                                              protocol):
    app_env = f"homes-{uuid.uuid4().hex[:8]}"
    subs = [ready_subscriber(d.pub, d.router, app_env) for d in two_devices]
    homes = tmp_path / "homes"
    bridge = _bridge(protocol, two_devices, homes, app_env, linked=True)
    bridges.append(bridge)
    events = [orjson.dumps({"message": f"event {i}", "@metadata": {"_id": f"resend-{i}"}}) for i in range(20)]
    nonce = os.urandom(16)
    if protocol == "lumberjack":
        other = _lumberjack_window(bridge.port, [b'{"message":"other"}'])
        mine = _lumberjack_window(bridge.port, events)
    else:
        other = TestCourierClient(bridge.port)
        other.send([b'{"message":"other"}'])
        other.wait_all_acked()
        mine = TestCourierClient(bridge.port)
        mine.send(events, nonce=nonce)
        mine.wait_all_acked()
    # Homes go by fewest connections, then in turn: start_bridge's port probe took device 0's
    # turn (and left), `other` got device 1, `mine` device 0.
    first = _device_of(subs, app_env, 21)
    assert sorted(first) == [0] * 20 + [1], first
    os.kill(bridge.proc.pid, signal.SIGKILL)
    bridge.proc.wait(10)
    other.close()
    mine.close()

    # The restarted bridge's port probe takes device 0's turn again, so a new connection is
    # homed on device 1. The resend goes to device 0, where the first copy is.
    bridge = _bridge(protocol, two_devices, homes, app_env, linked=True)
    bridges.append(bridge)
    if protocol == "lumberjack":
        _lumberjack_window(bridge.port, events).close()
    else:
        with TestCourierClient(bridge.port) as again:
            again.send(events, nonce=nonce)
            again.wait_all_acked()
    resent = _device_of(subs, app_env, 20)
    assert resent == [0] * 20, resent
    stray = [m for sub in subs for m in sub.recv_batch(timeout=0.5) if ours(m, app_env)]
    assert not stray, f"more than the 20 resent messages arrived: {stray}"
    assert stop(bridge.proc) == 0, bridge.output()
    for sub in subs:
        sub.close()


def test_a_rehomed_connection_waits_for_its_home_rather_than_go_elsewhere(tmp_path):
    """Just after a restart, the device of the first copy may not be connected yet (or be
    restarting itself): the resend waits for it, as what was in flight to a device does."""
    a = start_device(1)
    ports = {name: free_port() for name in ("router", "pull", "pub", "stats")}
    b_router = f"tcp://127.0.0.1:{ports['router']}"
    homes = BatchHomes(tmp_path / "homes")
    homes.remember(b"resent-0", device_tag(b_router))
    b = None
    try:
        async def run() -> None:
            nonlocal b
            link = DeviceLink([a.router, b_router], batch_homes=homes)
            link.start()
            await asyncio.wait_for(_until(lambda: link.connected[a.router]), 10)
            affinity = link.affinity()
            assert affinity.home.endpoint == a.router  # the only one connected
            assert link.rehome(affinity, b"resent-0")
            call = asyncio.ensure_future(link.publish([Message.build("homes-wait", "logs", {"i": 0})], affinity,
                                                      b"resent-0"))
            await asyncio.sleep(1.0)
            assert not call.done()  # not sent to a, which answers
            b = start_device(2, ports=ports)
            await asyncio.wait_for(call, 20)
            assert not affinity.resend  # answered: from now on its calls follow the usual rules
            assert link.connected[b_router]
            await link.close()

        asyncio.run(run())
    finally:
        for dev in (a, b):
            if dev is not None:
                assert stop(dev.proc) == 0, dev.output()


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.02)
