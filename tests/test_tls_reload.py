"""SIGHUP reloads a bridge's TLS files without dropping anyone (bridges/host/tls.py).

A real Lumberjack bridge serves certificate A; a client connects and sends. The files
are replaced by certificate B (another CA) and the bridge gets SIGHUP: a new connection
is served B, the connection made before keeps working on A, and every event arrives.
A reload whose files do not load is refused: new connections keep getting B.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import urllib.request
import uuid
from pathlib import Path

import pytest

from bridges.lumberjack.engine import AckFrame, LumberjackClient
from tests.bridge_support import collect, no_more, ready_subscriber, stop_bridge
from harness.processes import free_port, wait_for
from tests.lumberjack_support import start_lumberjack
from tests.test_lumberjack_bridge import send_window, tagged
from tests import tls_certs
from tests.tls_certs import make_certs


def reloads(port: int, result: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    for line in text.splitlines():
        if line.startswith("logjam_bridge_tls_reloads_total{") and f'result="{result}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def install(src_cert: Path, src_key: Path, cert: Path, key: Path) -> None:
    """Replace the live files the way a certificate manager does: write aside, then rename."""
    for src, dst in ((src_cert, cert), (src_key, key)):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)


def tls_connect(port: int, *cas: Path) -> ssl.SSLSocket:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cafile=str(cas[0]))
    for ca in cas[1:]:
        ctx.load_verify_locations(cafile=str(ca))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def two_certificates(tmp_path: Path) -> tuple[tls_certs.TestCerts, tls_certs.TestCerts, Path, Path]:
    """Certificates A and B (two CAs), and the live cert and key files, holding A."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = make_certs(tmp_path / "a"), make_certs(tmp_path / "b")
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "server.crt", live / "server.key"
    install(a.server_cert, a.server_key, cert, key)
    return a, b, cert, key


@pytest.mark.timeout(120)
def test_sighup_rotates_the_certificate_and_keeps_open_connections(device, tmp_path) -> None:
    a, b, cert, key = two_certificates(tmp_path)
    mport = free_port()
    bridge = start_lumberjack(device.router, "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", str(mport))
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    run = uuid.uuid4().hex
    try:
        old = tls_connect(bridge.port, a.ca)
        assert old.getpeercert(binary_form=True) == der(a.server_cert)
        old_client = LumberjackClient()
        assert send_window(old, old_client, tagged(50, run))[-1] == AckFrame(0x32, 50)

        install(b.server_cert, b.server_key, cert, key)
        os.kill(bridge.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(mport, "ok") == 1, timeout=10, what="the reload to be counted")

        # New connections get B: a client trusting only A's CA now fails, one trusting B's succeeds.
        with pytest.raises(ssl.SSLCertVerificationError):
            tls_connect(bridge.port, a.ca).close()
        with tls_connect(bridge.port, b.ca) as new:
            assert new.getpeercert(binary_form=True) == der(b.server_cert)
            assert send_window(new, LumberjackClient(), tagged(50, run, start=50))[-1] == AckFrame(0x32, 50)

        # The connection made before the reload still works, on A.
        assert send_window(old, old_client, tagged(50, run, start=100))[-1] == AckFrame(0x32, 100)
        assert old.getpeercert(binary_form=True) == der(a.server_cert)
        old.close()

        # A broken rotation (a key that does not match) is refused; B stays in use.
        key.write_bytes(a.server_key.read_bytes())
        os.kill(bridge.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(mport, "failed") == 1, timeout=10, what="the failed reload to be counted")
        with tls_connect(bridge.port, b.ca) as again:
            assert again.getpeercert(binary_form=True) == der(b.server_cert)
            assert send_window(again, LumberjackClient(), tagged(10, run, start=150))[-1] == AckFrame(0x32, 10)

        got = collect(sub, bridge.app_env, 160)
        assert sorted(body["n"] for _, body in got) == list(range(160))
        assert no_more(sub, bridge.app_env, 0.5) == []
    finally:
        sub.close()
        out = stop_bridge(bridge)
    assert out.count("SIGHUP: reloaded TLS certificate") == 1, out
    assert "SIGHUP: cannot reload TLS files" in out and "keeping the previous certificate" in out
