"""A device's ipc endpoints: this host's clients without CURVE, behind file permissions; TCP keeps CURVE.

A CURVE device with a data directory serves each of its five sockets on `<data-dir>/ipc/<name>`
too (logjam/endpoints.py). The directory is mode 0700 and the socket files 0600. A plaintext
client is served there, while on TCP only the allowlisted key gets in. Marked `native`: the
C loop reads the same sockets, so the messages through them go through each loop
(`native_mode`); the sockets' files, the replay server and the path check are the same whichever
loop runs, and are tested once.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import zmq

from logjam import endpoints
from logjam.producer import Producer, ReplyTimeout
from logjam.replay import ReplayClient
from logjam.subscriber import Subscriber
from runtime.curve import ensure
from harness.device import start_device
from harness.processes import stop, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.native]


def _curve_device(tmp_path: Path, native: str | None = None):
    ensure(tmp_path / "keys")
    dev = start_device(keys=tmp_path / "keys", extra=["--data-dir", str(tmp_path / "device")], native=native)
    yield dev, tmp_path / "device" / "ipc"
    assert stop(dev.proc) == 0, dev.output()


@pytest.fixture
def curve_device(tmp_path: Path):
    """A CURVE device with a data directory, on the loop LOGJAM_NATIVE gives (the tests that take it
    assert on what the sockets are, not on what a loop does with a message)."""
    yield from _curve_device(tmp_path)


@pytest.fixture
def curve_device_each_loop(tmp_path: Path, native_mode: str):
    """The same, once on the C loop and once on the Python loop."""
    yield from _curve_device(tmp_path, native_mode)


def test_the_ipc_directory_and_sockets_are_the_users_alone(curve_device) -> None:
    dev, ipc = curve_device
    assert ipc.stat().st_mode & 0o777 == 0o700 and ipc.stat().st_uid == os.geteuid()
    assert sorted(p.name for p in ipc.iterdir()) == sorted(endpoints.SOCKETS)
    for path in ipc.iterdir():
        assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600, path


def test_plaintext_over_ipc_and_only_the_key_over_tcp(curve_device_each_loop) -> None:
    dev, ipc = curve_device_each_loop
    ctx = zmq.Context.instance()
    sub = Subscriber([endpoints.ipc_endpoint(ipc, "pub")], context=ctx)
    try:
        local = Producer(endpoints.ipc_endpoint(ipc, "router"), context=ctx, timeout=5, linger_ms=0)
        keyed = Producer(dev.router, context=ctx, timeout=5, linger_ms=0, curve=dev.curve)
        stranger = Producer(dev.router, context=ctx, timeout=1, linger_ms=0)
        try:
            assert local.ping() and keyed.ping()
            with pytest.raises(ReplyTimeout):
                stranger.ping()  # no CURVE on TCP: the handshake never completes

            def delivered() -> bool:
                assert local.request("ipc-prod", "logs", {"via": "ipc"})  # answered 202
                assert keyed.request("tcp-prod", "logs", {"via": "tcp"})
                got = {m.app_env for m in _drain(sub, 0.5)}
                return {"ipc-prod", "tcp-prod"} <= got

            wait_for(delivered, timeout=30, interval=0.2, what="both producers' messages on the ipc PUB")
        finally:
            for p in (local, keyed, stranger):
                p.close(ping=False)
    finally:
        sub.close()


def test_replay_beside_the_pub_endpoint(curve_device) -> None:
    dev, ipc = curve_device
    from importer.sequence import replay_endpoint

    endpoint = replay_endpoint(endpoints.ipc_endpoint(ipc, "pub"), 9607)
    assert endpoint == endpoints.ipc_endpoint(ipc, "replay")
    client = ReplayClient(endpoint, context=zmq.Context.instance(), timeout=5)
    try:
        assert client.info().journal_id
    finally:
        client.close()


def test_tools_find_live_devices_only(curve_device, tmp_path: Path) -> None:
    dev, ipc = curve_device
    assert endpoints.local_devices("router", tmp_path) == [endpoints.ipc_endpoint(ipc, "router")]
    stale = tmp_path / "device-1" / "ipc"
    stale.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody listens on any more
        s.bind(str(stale / "router"))
    assert endpoints.local_devices("router", tmp_path) == [endpoints.ipc_endpoint(ipc, "router")]


def test_a_path_too_long_for_a_unix_socket_leaves_tcp_alone(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    assert not endpoints.ipc_fits(endpoints.ipc_dir(deep))
    dev = start_device(extra=["--data-dir", str(deep)])
    try:
        assert not (deep / "ipc").exists()
    finally:
        assert stop(dev.proc) == 0
    assert "too long for a Unix socket" in dev.output()


def _drain(sub: Subscriber, seconds: float) -> list:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += [m for m in sub.recv_batch(timeout=0.1) if hasattr(m, "app_env")]
    return out


def test_client_key_is_not_needed_for_ipc_alone(tmp_path: Path) -> None:
    from argparse import Namespace

    from runtime.curve import ClientCurve

    args = Namespace(plaintext=False, keys=str(tmp_path / "none"), curve_secret=None, curve_server_key=None)
    flags = ClientCurve.from_flags(args)
    assert flags.load(["ipc:///x/device/ipc/router"]) is None
    with pytest.raises(ValueError, match="none/client.key_secret"):
        flags.load(["ipc:///x/device/ipc/router", "tcp://127.0.0.1:9604"])
