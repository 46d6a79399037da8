"""Real third-party Lumberjack clients against `logjam-bridge lumberjack` and a real device:
each sends N events; all N reach a subscriber with the right content, and the clients that
wait for acks get them (they would block or fail otherwise)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import uuid

import pytest

from tests.bridge_support import collect, no_more, ready_subscriber, stop_bridge
from tests.lumberjack_support import NODE_DIR, start_lumberjack

N = 120


def tls_flags(certs, mutual: bool = False) -> list[str]:
    flags = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    if mutual:
        flags += ["--tls-client-ca", str(certs.ca), "--tls-client-auth", "required"]
    return flags


def check_all_arrived(sub, app_env: str, n: int, run: str, fields=lambda body: body) -> list[dict]:
    """Exactly n messages, tagged with `run` and numbered 0..n-1 (in `fields(body)`)."""
    got = collect(sub, app_env, n)
    assert no_more(sub, app_env, 0.5) == []
    bodies = [body for _, body in got if fields(body).get("run") == run]
    assert len(bodies) == n
    assert sorted(int(fields(b)["n"]) for b in bodies) == list(range(n))
    return bodies


# ---------------------------------------------------------------- PyPI


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_pylogbeat(device, certs, mutual: bool) -> None:
    import pylogbeat

    b = start_lumberjack(device.router, *tls_flags(certs, mutual))
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        kwargs = dict(ssl_enable=True, ssl_verify=True, ca_certs=str(certs.ca), timeout=30)
        if mutual:
            kwargs.update(certfile=str(certs.client_cert), keyfile=str(certs.client_key))
        client = pylogbeat.PyLogBeatClient("127.0.0.1", b.port, **kwargs)
        with client:
            # send() returns only once it read the ack for the window's last seq.
            for start in range(0, N, 40):
                client.send([{"message": f"pylogbeat {i}", "run": run, "n": i} for i in range(start, start + 40)])
            assert client._last_ack == N
        bodies = check_all_arrived(sub, b.app_env, N, run)
        meta = bodies[0]["@metadata"]
        assert meta["protocol_version"] == "2" and meta["tls"]["version"]
        assert meta["tls"]["cn"] == ("test-client" if mutual else None)
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_python_logstash_async_beats_transport(device) -> None:
    from logstash_async.handler import AsynchronousLogstashHandler

    b = start_lumberjack(device.router)
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        handler = AsynchronousLogstashHandler(
            "127.0.0.1", b.port, database_path=None,
            transport="logstash_async.transport.BeatsTransport", ssl_enable=False,
        )
        logger = logging.getLogger(f"lj-interop-{run}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            for i in range(N):
                logger.info("logstash-async %d", i, extra={"run": run, "n": i})
            handler.flush()
        finally:
            logger.removeHandler(handler)
            handler.shutdown()  # flushes what is queued (batches of 25, each waiting for its ack)
            handler.close()
        # The formatter puts `extra` fields under "extra".
        bodies = check_all_arrived(sub, b.app_env, N, run, fields=lambda body: body["extra"])
        sample = next(x for x in bodies if x["extra"]["n"] == 7)
        assert sample["message"] == "logstash-async 7"
        assert sample["level"] == "INFO"
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_timbersnake(device) -> None:
    from timbersnake.client import Client

    b = start_lumberjack(device.router)
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        # One connection: W 3 and N events (numbered from 0) inside one C frame, then it reads one ack.
        asyncio.run(asyncio.wait_for(
            Client("127.0.0.1", b.port).send([{"message": f"timbersnake {i}", "run": run, "n": i} for i in range(N)]), 30
        ))
        bodies = check_all_arrived(sub, b.app_env, N, run)
        assert sorted(x["@metadata"]["seq"] for x in bodies) == list(range(N))
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_stashward_tls(device, certs) -> None:
    from stashward.handler import StashwardHandler

    b = start_lumberjack(device.router, *tls_flags(certs))
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        # v1 over TLS: W 2^32-1 when created, then one D frame per record; it never reads acks.
        handler = StashwardHandler("127.0.0.1", b.port, ca_certs=str(certs.ca), message_type="interop")
        assert handler.sock is not None, "stashward could not connect"
        logger = logging.getLogger(f"lj-stashward-{run}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            for i in range(N):
                logger.info("stashward %d", i, extra={"run": run, "n": i})
            # Close only once everything arrived: stashward never reads, so a close with
            # unread bytes (a TLS 1.3 session ticket) is a reset that can discard what its
            # kernel had not sent yet. That is the client's loss, not the bridge's.
            bodies = check_all_arrived(sub, b.app_env, N, run)
            handler.sock.settimeout(0.2)
            try:
                unread = handler.sock.recv(65536)
            except TimeoutError:
                unread = b""
            assert b"1A" not in unread, "a window of 2^32-1 is never acked"
        finally:
            logger.removeHandler(handler)
            handler.close()
        sample = next(x for x in bodies if x["n"] == "5")
        # Both `message` and `line` (its line number) are sent; the explicit message wins.
        assert sample["message"] == "stashward 5" and sample["type"] == "interop"
        assert sample["@metadata"]["protocol_version"] == "1"
        assert sorted(x["@metadata"]["seq"] for x in bodies) == list(range(N))
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- npm


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not installed")
    for pkg in ("lumberjack-protocol", "lumberjack-client"):
        assert (NODE_DIR / "node_modules" / pkg).is_dir(), f"npm {pkg} missing: run `make node-clients`"
    return exe


@pytest.mark.timeout(90)
def test_npm_lumberjack_protocol_tls(device, certs, node) -> None:
    b = start_lumberjack(device.router, *tls_flags(certs))
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        out = subprocess.run(
            [node, "send_lumberjack_protocol.js", "127.0.0.1", str(b.port), str(certs.ca), str(N), run],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=70,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        assert json.loads(out.stdout.strip().splitlines()[-1])["lastAck"] == N
        bodies = check_all_arrived(sub, b.app_env, N, run)
        sample = next(x for x in bodies if x["n"] == "3")
        assert sample["message"] == "node-protocol 3" and "line" not in sample
        assert sorted(x["@metadata"]["seq"] for x in bodies) == list(range(1, N + 1))
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_npm_lumberjack_client(device, node) -> None:
    b = start_lumberjack(device.router)
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        out = subprocess.run(
            [node, "send_lumberjack_client.js", "127.0.0.1", str(b.port), str(N), run],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=70,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        bodies = check_all_arrived(sub, b.app_env, N, run)
        assert bodies[0]["message"].startswith("node-client ")
        assert bodies[0]["@timestamp"] == "2024-05-01T12:00:00.000Z"
        sub.close()
    finally:
        stop_bridge(b)
