"""`logjam-bridge syslog` over real sockets with a real device and subscriber: both TCP
framings on one connection, TLS, UDP, RELP with its acks after the device's 202 (a paused
device holds every rsp), app-env from APP-NAME, and a bad frame next to a good connection.
util-linux `logger` is the real client here; rsyslog and syslog-ng are in test_syslog_interop.py.

Every test whose messages reach the device runs twice, under LOGJAM_NATIVE=require (the bridge's
C device link, its C body writer and UDP reader (native/syslog.c), the device's C loop) and off
(their Python twins): `native_device` is on each. The syslog engine is Python on both paths, so the
frame refused on its length alone (nothing reaches the device) runs once, on `device`."""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from bridges.syslog.engine import SyslogClient
from bridges.syslog.relp import RelpClient, Response, ServerClose
from runtime.health import fetch
from tests.bridge_support import client_tls, collect, ready_subscriber, stop_bridge
from harness.processes import free_port, wait_for
from tests.test_tls_reload import der, install, reloads, tls_connect
from tests.tls_certs import make_certs
from tests.syslog_support import landed_once, relp_send, run_id, start_syslog, tls_flags

# Native-sensitive (LOGJAM_NATIVE picks the C path or its Python twin): `native_device` runs on both.
pytestmark = pytest.mark.native

N = 200
LOGGER = shutil.which("logger")


def test_both_framings_on_one_connection_with_5424_fields(native_device) -> None:
    b = start_syslog(native_device.router)
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        counted, lf = SyslogClient("octet-counting"), SyslogClient("lf")
        with socket.create_connection(("127.0.0.1", b.port)) as s:
            for i in range(N):
                msg = (b'<165>1 2026-11-27T10:00:00.5Z web-1 app 42 ID7 [ex@1 k="a\\"b\\]c\\d"] '
                       b"\xef\xbb\xbfrun %b %d\n" % (run.encode(), i))
                s.sendall(counted.send(msg) if i % 2 else lf.send(msg.rstrip(b"\n")))
        bodies = landed_once(sub, b.app_env, run, N)
        body = bodies[0]
        assert body["syslog"] == {"format": "rfc5424", "priority": 165, "facility": 20, "severity": 5, "version": 1,
                                  "timestamp": "2026-11-27T10:00:00.5Z", "hostname": "web-1", "app_name": "app",
                                  "procid": "42", "msgid": "ID7", "structured_data": {"ex@1": {"k": 'a"b]c\\d'}}}
        assert body["@timestamp"] == "2026-11-27T10:00:00.5Z"
        assert body["created_ms"] == 1795773600500  # meta created_ms from @timestamp
        assert body["raw"].startswith("<165>1 2026-11-27T10:00:00.5Z web-1")
        assert {b["@metadata"]["framing"] for b in bodies} == {"octet-counting", "lf"}
        assert not any(b["message"].endswith("\n") or b["raw"].endswith("\n") for b in bodies)
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.skipif(LOGGER is None, reason="util-linux logger is not installed")
@pytest.mark.parametrize("mode", ["octet-count", "lf", "udp"])
def test_logger(native_device, mode: str) -> None:
    b = start_syslog(native_device.router, udp=True)
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        flags = {"octet-count": ["--tcp", "--octet-count"], "lf": ["--tcp"], "udp": ["--udp"]}[mode]
        lines = "".join(f"run {run} {i}\n" for i in range(N))
        # logger sends stdin line by line; over UDP, a datagram each (it paces nothing, and
        # loopback with our receive buffer takes 200 small datagrams).
        subprocess.run([LOGGER, *flags, "--rfc5424", "-n", "127.0.0.1", "-P", str(b.port), "-t", "mytag",
                        "-p", "local3.warning"], input=lines, text=True, check=True, timeout=30)
        bodies = landed_once(sub, b.app_env, run, N)
        s = bodies[0]["syslog"]
        assert (s["format"], s["app_name"], s["facility"], s["severity"]) == ("rfc5424", "mytag", 19, 4)
        assert "timeQuality" in s["structured_data"]
        framing = {"octet-count": "octet-counting", "lf": "lf", "udp": "udp"}[mode]
        assert {b["@metadata"]["framing"] for b in bodies} == {framing}
        sub.close()
    finally:
        stop_bridge(b)


def test_rfc3164_and_app_env_from_app_name(native_device) -> None:
    env = "prod"
    b = start_syslog(native_device.router, "--app-name-environment", env)
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, f"billing-{env}")
        fallback = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        with socket.create_connection(("127.0.0.1", b.port)) as s:
            s.sendall(b"".join(b"<38>Jan  5 01:02:03 host-a billing[77]: run %b %d\n" % (run.encode(), i)
                               for i in range(10)))
            s.sendall(b"<38>Jan  5 01:02:03 host-a run %b 0\n" % run.encode())  # no tag: --app-env
        bodies = landed_once(sub, f"billing-{env}", run, 10)
        sl = bodies[0]["syslog"]
        assert (sl["format"], sl["hostname"], sl["app_name"], sl["procid"]) == ("rfc3164", "host-a", "billing", "77")
        assert bodies[0]["@timestamp"].endswith("-01-05T01:02:03+00:00")
        stamp = datetime.datetime.fromisoformat(bodies[0]["@timestamp"])
        assert bodies[0]["created_ms"] == int(stamp.timestamp() * 1000)
        landed_once(fallback, b.app_env, run, 1)
        sub.close()
        fallback.close()
    finally:
        stop_bridge(b)


def test_tls_octet_counted(native_device, certs) -> None:
    b = start_syslog(native_device.router, *tls_flags(certs))
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        client = SyslogClient()
        with socket.create_connection(("127.0.0.1", b.port)) as raw:
            with client_tls(certs).wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"".join(client.send(b"<14>1 - h a - - - run %b %d" % (run.encode(), i)) for i in range(N)))
        bodies = landed_once(sub, b.app_env, run, N)
        assert bodies[0]["@metadata"]["tls"]["version"].startswith("TLS")
        sub.close()
    finally:
        stop_bridge(b)


def test_relp_acks_each_message_after_the_device(native_device) -> None:
    b = start_syslog(native_device.router, "--relp")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        answers = relp_send(b.port, [b"<13>1 - h relpapp - - - run %b %d" % (run.encode(), i) for i in range(N)])
        assert [a.txnr for a in answers] == list(range(1, N + 3))
        assert all(a.code == 200 for a in answers)
        assert b"relp_version=0" in answers[0].data and b"commands=syslog" in answers[0].data
        bodies = landed_once(sub, b.app_env, run, N)
        assert sorted(x["@metadata"]["txnr"] for x in bodies) == list(range(2, N + 2))
        assert {x["@metadata"]["protocol_version"] for x in bodies} == {"relp"}
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_relp_paused_device_holds_every_rsp(native_device) -> None:
    b = start_syslog(native_device.router, "--relp")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        client = RelpClient()
        with socket.create_connection(("127.0.0.1", b.port), timeout=30) as s:
            s.sendall(client.send("open"))
            wait_for(lambda: client.feed(s.recv(4096)) != [], timeout=10, what="open rsp")
            os.kill(native_device.proc.pid, signal.SIGSTOP)
            try:
                s.sendall(b"".join(client.send("syslog", b"<13>run %b %d" % (run.encode(), i)) for i in range(20)))
                s.settimeout(2)
                with pytest.raises(socket.timeout):
                    s.recv(4096)  # nothing is answered while the device cannot accept
            finally:
                os.kill(native_device.proc.pid, signal.SIGCONT)
            s.settimeout(30)
            got: list[Response] = []
            while client.unanswered:
                got += client.feed(s.recv(65536))
            assert [r.txnr for r in got] == list(range(2, 22))
        landed_once(sub, b.app_env, run, 20)
        sub.close()
    finally:
        stop_bridge(b)


def test_bad_relp_frame_closes_only_that_connection(native_device) -> None:
    b = start_syslog(native_device.router, "--relp")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as bad:
            bad.sendall(b"1 syslog 3 abc\n")  # before open
            assert bad.recv(100) == b""
        run = run_id()
        relp_send(b.port, [b"<13>run %b %d" % (run.encode(), i) for i in range(5)])
        landed_once(sub, b.app_env, run, 5)
        sub.close()
    finally:
        out = stop_bridge(b)
    assert "relp_not_open" in out


def test_oversize_counted_frame_is_refused_on_its_length(device) -> None:
    b = start_syslog(device.router, "--max-frame-size", "1000")
    try:
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            s.sendall(b"99999999 <13>x")
            assert s.recv(100) == b""
    finally:
        out = stop_bridge(b)
    assert "frame_too_large" in out


@pytest.mark.timeout(60)
def test_sighup_reloads_the_tls_certificate(native_device, tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = make_certs(tmp_path / "a"), make_certs(tmp_path / "b")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    install(a.server_cert, a.server_key, cert, key)
    mport = free_port()
    bridge = start_syslog(native_device.router, "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", str(mport))
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
        run = run_id()
        with tls_connect(bridge.port, a.ca) as old:
            assert old.getpeercert(binary_form=True) == der(a.server_cert)
            install(b.server_cert, b.server_key, cert, key)
            os.kill(bridge.proc.pid, signal.SIGHUP)
            wait_for(lambda: reloads(mport, "ok") == 1, timeout=10, what="the reload to be counted")
            with tls_connect(bridge.port, b.ca) as new:
                assert new.getpeercert(binary_form=True) == der(b.server_cert)
                new.sendall(SyslogClient().send(b"<13>1 - h a - - - run %b 1" % run.encode()))
            old.sendall(SyslogClient().send(b"<13>1 - h a - - - run %b 0" % run.encode()))  # still on A
        landed_once(sub, bridge.app_env, run, 2)
        sub.close()
        code, health = fetch(f"http://127.0.0.1:{mport}/healthz")
        assert code == 200 and health is not None and health["healthy"], health
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'logjam_bridge_events_received_total{protocol="syslog"} 2.0' in metrics
    finally:
        stop_bridge(bridge)


@pytest.mark.timeout(60)
def test_udp_while_the_device_is_stopped_drops_and_counts(native_device) -> None:
    """UDP cannot push back: with 64 batches waiting on a stopped device and one more batch of
    256 gathered behind them, further datagrams are dropped and counted; what was kept lands
    once the device resumes (at-most-once)."""
    mport = free_port()
    b = start_syslog(native_device.router, "--metrics-port", str(mport), udp=True)
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        run = run_id()
        os.kill(native_device.proc.pid, signal.SIGSTOP)
        try:
            sent = 400
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(sent):
                    s.sendto(b"<13>1 - h a - - - run %b %d" % (run.encode(), i), ("127.0.0.1", b.port))
                    if i < 80:
                        # One batch each (a batch is what gathered in 2 ms), 64 of them to fill the
                        # device link, with 16 to spare for a loaded machine that reads two at once.
                        time.sleep(0.01)

            def counts() -> dict[str, float]:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
                    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                            if line.startswith(("logjam_bridge_datagrams_dropped_total",
                                                "logjam_bridge_events_received_total"))}

            # Every datagram is either forwarded (received) or dropped (counted), none unaccounted for.
            c = wait_for(lambda: (c := counts()) and sum(c.values()) == sent and c, timeout=10,
                         what="every datagram received or counted as dropped")
            lost = int(c["logjam_bridge_datagrams_dropped_total"])
        finally:
            os.kill(native_device.proc.pid, signal.SIGCONT)
        assert 0 < lost <= sent - 64 - 256, c
        got = collect(sub, b.app_env, sent - lost, timeout=30)
        assert len(got) == sent - lost
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_relp_at_shutdown_answers_what_was_forwarded_then_says_serverclose(native_device) -> None:
    b = start_syslog(native_device.router, "--relp")
    stopped = False
    try:
        client = RelpClient()
        with socket.create_connection(("127.0.0.1", b.port), timeout=30) as s:
            s.sendall(client.send("open") + b"".join(client.send("syslog", b"<13>m %d" % i) for i in range(20)))
            got: list = []
            while client.unanswered:
                got += client.feed(s.recv(65536))
            b.proc.terminate()
            stopped = True
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert client.feed(data) == [ServerClose()]
        assert [r.code for r in got] == [200] * 21
    finally:
        if not stopped:
            b.proc.terminate()
        assert b.proc.wait(20) == 0, b.output()
