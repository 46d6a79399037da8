"""CURVE on a real logjam-device: who gets in and out through ROUTER, PULL, PUB, stats and replay.

Three kinds of stranger: a client without CURVE, a client with a key pair of its own but
another server's public key, and a client with the right server key whose own key is not on
the allowlist. None of them gets a message out of PUB, stats or replay, nor one into the
device (a message the device took would be published: PUB is the only way into the table,
and the allowlisted subscriber here sees everything published). The allowlisted client
works on every socket, a key added to the allowlist works after SIGHUP, and every refusal is
a WARNING line and a metric. Marked `native`: the C loop reads the same CURVE sockets, so every
test whose messages go through a device's loop or a bridge's link runs on each (`native_mode`);
key files and a client or device that stops at its key check before any loop runs are tested once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import zmq
import zmq.auth

from logjam.curve import ClientKey
from logjam.producer import Producer, ReplyTimeout
from logjam.replay import ReplayClient, ReplayTimeout
from logjam.subscriber import Subscriber
from runtime.curve import ensure
from harness.device import start_device
from harness.processes import free_port, stop, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.native]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    made = ensure(tmp_path / "keys")
    assert made == ["server", "client"]
    return tmp_path / "keys"


def test_key_files_are_zmq_auth_certificates_with_private_secrets(keys: Path) -> None:
    for name in ("server", "client"):
        assert (keys / f"{name}.key_secret").stat().st_mode & 0o777 == 0o600
        public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
        assert len(public) == 40 and secret is not None and len(secret) == 40
        assert zmq.auth.load_certificate(keys / f"{name}.key")[1] is None
    assert keys.stat().st_mode & 0o777 == 0o700
    assert set(zmq.auth.load_certificates(keys / "allowed")) == {zmq.auth.load_certificate(keys / "client.key")[0]}
    assert ensure(keys) == []  # a second start keeps them


class Strangers:
    """Client keys the device must refuse: None (plaintext), another server key, not on the allowlist."""

    def __init__(self, keys: Path, tmp: Path) -> None:
        good = ClientKey.from_dir(keys)
        tmp.mkdir()
        _, intruder = zmq.auth.create_certificates(tmp, "intruder")
        self.intruder_cert = tmp / "intruder.key"
        public, secret = zmq.auth.load_certificate(intruder)
        other_server, _ = zmq.curve_keypair()
        self.by_name: dict[str, ClientKey | None] = {
            "plaintext": None,
            "wrong_server_key": ClientKey(good.public, good.secret, other_server),
            "not_allowed": ClientKey(public, secret, good.server_public),  # type: ignore[arg-type]
        }


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _collect(sub: Subscriber, timeout: float) -> dict[str, list[bytes]]:
    """Bodies by app-env that `sub` gets within `timeout` (heartbeats left out)."""
    got: dict[str, list[bytes]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in sub.recv_batch(timeout=0.1):
            app_env = getattr(m, "app_env", "heartbeat")
            if app_env != "heartbeat":
                got.setdefault(app_env, []).append(bytes(m.body))
    return got


def _received(sub: Subscriber, app_env: str, timeout: float) -> list[bytes]:
    return _collect(sub, timeout).get(app_env, [])


def _sub(endpoint: str, key: ClientKey | None, ctx: zmq.Context) -> zmq.Socket:
    s = ctx.socket(zmq.SUB)
    s.linger = 0
    if key is not None:
        key.apply(s)
    s.subscribe(b"")
    s.connect(endpoint)
    return s


def test_only_allowlisted_clients_send_read_and_replay(keys: Path, tmp_path: Path, native_mode: str) -> None:
    strangers = Strangers(keys, tmp_path / "strangers")
    metrics_port, replay_port = free_port(), free_port()
    dev = start_device(keys=keys, extra=["--data-dir", str(tmp_path / "dev"), "--replay-port", str(replay_port),
                                         "--metrics-port", str(metrics_port), "--heartbeat-interval", "0.2"],
                       native=native_mode)
    replay = f"tcp://127.0.0.1:{replay_port}"
    ctx = zmq.Context()
    try:
        good = dev.curve
        sub = Subscriber(dev.pub, ["curve-"], context=ctx, curve=good)
        with Producer(dev.router, context=ctx, curve=good) as p:
            wait_for(lambda: p.request("curve-ok", "logs", b'{"warm":1}') and _received(sub, "curve-ok", 0.3),
                     timeout=20, what="the allowlisted subscriber to get an allowlisted request")

        # Strangers listen on PUB and stats, and send through ROUTER and PULL.
        listeners = {name: (_sub(dev.pub, key, ctx), _sub(dev.stats, key, ctx)) for name, key in strangers.by_name.items()}
        # They stay connected (retrying the handshake) until the end, so that each refusal is seen
        # even when a loaded machine makes the first handshake slow.
        strays = []
        for name, key in strangers.by_name.items():
            bad = Producer(dev.router, context=ctx, curve=key, timeout=2, linger_ms=0)
            with pytest.raises(ReplyTimeout):
                bad.request(f"curve-{name.replace('_', '-')}", "logs", b'{"bad":1}')
            push = Producer(dev.pull, mode="push", context=ctx, curve=key, linger_ms=0)
            push.send(f"curve-{name.replace('_', '-')}", "logs", b'{"bad":2}')
            strays += [bad, push]
            with pytest.raises(ReplayTimeout):
                ReplayClient(replay, context=ctx, timeout=2, curve=key).info()

        # The allowlisted client goes on working on every socket, PULL included.
        with Producer(dev.pull, mode="push", context=ctx, curve=good) as push:
            push.send("curve-ok", "logs", b'{"after":1}')
        with Producer(dev.router, context=ctx, curve=good) as p:
            assert p.request("curve-ok", "logs", b'{"after":2}')
        info = ReplayClient(replay, context=ctx, timeout=10, curve=good).info()
        assert info.last >= 3
        got = {k: sorted(v) for k, v in _collect(sub, 2.0).items()}
        assert got == {"curve-ok": [b'{"after":1}', b'{"after":2}']}, got
        sub.close()
        # ... and nothing of what was published reached a stranger, heartbeats and stats included.
        for name, socks in listeners.items():
            for s in socks:
                assert not s.poll(0), f"{name} received something"
                s.close()

        text = _metrics(metrics_port)
        # A wrong server key and a key off the allowlist are refused by the device on every socket.
        # A client without CURVE sees the mismatch itself and may hang up first: the device counts
        # the handshakes it saw fail that way, which need not be every one.
        def counted(sock: str, reason: str) -> bool:
            return f'logjam_device_curve_refused_total{{reason="{reason}",socket="{sock}"}}' in _metrics(metrics_port)

        for sock in ("router", "pull", "pub", "stats"):
            for reason in ("bad_handshake", "not_allowed"):
                wait_for(lambda: counted(sock, reason), timeout=10, what=f"a {reason} refusal counted on {sock}")
        wait_for(lambda: any(counted(sock, "no_curve") for sock in ("router", "pull", "pub", "stats")), timeout=10,
                 what="a no_curve refusal counted")
        assert 'logjam_device_received_total{socket="pull"} 1.0' in text  # after:1 only
        text = _metrics(metrics_port)
        for reason in ("bad_handshake", "not_allowed"):  # the replay clients have given up by now
            assert f'logjam_device_curve_refused_total{{reason="{reason}",socket="replay"}}' in text, text
        for stray in strays:
            stray.close(ping=False)
    finally:
        ctx.destroy(linger=0)
        code = stop(dev.proc)
    out = dev.output()
    assert code == 0, out
    # Refusals are WARNING lines naming the peer's address where ZAP knows it: one per peer, socket and
    # reason (at most 15 kinds here), not one per reconnect (every 0.1 s, hundreds in this test), and at
    # most 10 in 10 s, as for TLS.
    lines = [line.split(" WARNING ", 1)[1] for line in out.splitlines() if "WARNING CURVE: refused" in line]
    assert 3 <= len(lines) <= 15, out
    assert any("refused 127.0.0.1 on" in line and "(not_allowed)" in line for line in lines), out
    assert any("(no_curve)" in line for line in lines) and any("(bad_handshake)" in line for line in lines), out
    assert len(set(lines)) == len(lines), out


def test_a_key_added_to_the_allowlist_is_admitted_after_sighup(keys: Path, tmp_path: Path, native_mode: str) -> None:
    strangers = Strangers(keys, tmp_path / "strangers")
    newcomer = strangers.by_name["not_allowed"]
    metrics_port = free_port()
    dev = start_device(keys=keys, extra=["--metrics-port", str(metrics_port)], native=native_mode)
    ctx = zmq.Context()
    try:
        with Producer(dev.router, context=ctx, curve=newcomer, timeout=1.5, linger_ms=0) as p:
            with pytest.raises(ReplyTimeout):
                p.request("curve-new", "logs", b"{}")
            p.close(ping=False)
        shutil.copy(strangers.intruder_cert, keys / "allowed" / "newcomer.key")
        os.kill(dev.proc.pid, signal.SIGHUP)
        wait_for(lambda: 'logjam_device_curve_allowed_keys 2.0' in _metrics(metrics_port), timeout=10,
                 what="the reload")
        with Producer(dev.router, context=ctx, curve=newcomer, timeout=10) as p:
            assert p.request("curve-new", "logs", b"{}")
        assert 'logjam_device_curve_reloads_total{result="ok"} 1.0' in _metrics(metrics_port)
        # Revoking: remove the file, SIGHUP; new connections are refused again.
        (keys / "allowed" / "newcomer.key").unlink()
        os.kill(dev.proc.pid, signal.SIGHUP)
        wait_for(lambda: 'logjam_device_curve_allowed_keys 1.0' in _metrics(metrics_port), timeout=10, what="the reload")
        with Producer(dev.router, context=ctx, curve=newcomer, timeout=1.5, linger_ms=0) as p:
            with pytest.raises(ReplyTimeout):
                p.request("curve-new", "logs", b"{}")
            p.close(ping=False)
    finally:
        ctx.destroy(linger=0)
        assert stop(dev.proc) == 0
    assert "SIGHUP: reloaded the CURVE allowlist" in dev.output()


def test_allow_plaintext_opens_the_named_sockets_and_says_so(keys: Path, tmp_path: Path, native_mode: str) -> None:
    metrics_port = free_port()
    dev = start_device(keys=keys, extra=["--allow-plaintext", "pull", "--metrics-port", str(metrics_port)],
                       native=native_mode)
    ctx = zmq.Context()
    try:
        sub = Subscriber(dev.pub, ["open-"], context=ctx, curve=dev.curve)
        with Producer(dev.pull, mode="push", context=ctx) as push:  # no key at all
            wait_for(lambda: push.send("open-pull", "logs", b"{}") and _received(sub, "open-pull", 0.3), timeout=20,
                     what="a plaintext PUSH through the open PULL")
        with Producer(dev.router, context=ctx, timeout=1.5, linger_ms=0) as p:  # ROUTER stays closed
            with pytest.raises(ReplyTimeout):
                p.request("open-router", "logs", b"{}")
            p.close(ping=False)
        sub.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=5) as r:
            detail = json.loads(r.read())["checks"]["curve"]["detail"]
        assert "OPEN" in detail and "pull" in detail.split("OPEN")[1], detail
    finally:
        ctx.destroy(linger=0)
        assert stop(dev.proc) == 0
    out = dev.output()
    assert "WARNING CURVE on router, pub, stats, replay" in out and "OPEN, plaintext without authentication: pull" in out, out


def test_a_client_without_its_key_file_says_what_to_do(tmp_path: Path) -> None:
    import subprocess

    from harness.processes import command

    res = subprocess.run([command("logjam-tail"), "--sub", "tcp://127.0.0.1:1", "--keys", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "client.key_secret" in res.stderr and "--plaintext" in res.stderr, res.stderr


def test_a_bridge_forwards_with_the_mesh_key_and_reports_a_refused_link(keys: Path, native_mode: str) -> None:
    """The bridge's DEALER takes the client key from --keys; a bridge without CURVE gets nothing in,
    says so once in its log, and its /healthz fails on the device link."""
    import subprocess
    import urllib.error

    from tests.bridge_support import start_bridge, stop_bridge
    from harness.processes import command

    dev = start_device(keys=keys, native=native_mode)
    ctx = zmq.Context()
    metrics = free_port()
    good = start_bridge("lumberjack", dev.router, "--keys", str(keys), native=native_mode)
    plain = start_bridge("lumberjack", dev.router, "--metrics-port", str(metrics), native=native_mode)  # --plaintext
    try:
        sub = Subscriber(dev.pub, [good.app_env, plain.app_env], context=ctx, curve=dev.curve)

        def send(bridge, text: str) -> int:
            return subprocess.run([command("logjam-send"), "lumberjack", "--to", bridge.to, "--timeout", "3", text],
                                  capture_output=True, text=True, timeout=30).returncode

        wait_for(lambda: send(good, "via curve") == 0 and _received(sub, good.app_env, 0.5), timeout=30,
                 what="an event through the bridge with the mesh's key")
        assert send(plain, "in clear") == 1
        assert _received(sub, plain.app_env, 1.0) == []
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5)
        doc = json.loads(refused.value.read())
        assert refused.value.code == 503 and doc["checks"]["device_link"]["ok"] is False, doc
        sub.close()
    finally:
        ctx.destroy(linger=0)
        good_out = stop_bridge(good)
        plain.proc.kill()  # it holds an unacknowledged event for a device that will never take it
        plain.proc.wait()
        stop(dev.proc)
    assert "refused the handshake" in plain.output(), plain.output()
    assert "refused the handshake" not in good_out


def test_a_missing_key_file_is_named_as_missing(tmp_path: Path) -> None:
    """--keys pointing at a directory without the files: the device says which file is missing and
    what creates it (zmq.auth alone said "Invalid certificate file")."""
    import subprocess

    from harness.processes import command, free_port

    res = subprocess.run([command("logjam-device"), "--bind", "127.0.0.1", "--keys", str(tmp_path),
                          "-t", str(free_port()), "-p", str(free_port()), "-P", str(free_port()), "-s", str(free_port()),
                          "--replay-port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert (f"the CURVE certificate {tmp_path / 'server.key_secret'} is missing: "
            f"`logjam-keys init --keys {tmp_path}` creates the mesh's keys") in res.stderr
