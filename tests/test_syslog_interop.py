"""Real syslog senders against `logjam-bridge syslog` and a real device: rsyslog (omfwd with
octet counting, omfwd over TLS, omrelp, and omrelp while the device stops) and syslog-ng.

Each daemon runs in the foreground (-n/-F) with its own config, pid file and work directory
under tmp_path, takes its input on a loopback TCP port of its own (never /dev/log or 514),
writes nothing under /var/log, and is killed when its test ends. `make syslog-clients`
installs them (rsyslog from Debian; syslog-ng-core unpacked into tests/syslog-ng, since the
two packages conflict). In each test every message lands once, with the documented fields;
the RELP test across a stopped device allows copies (at-least-once) and no loss."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.bridge_support import collect, no_more, ready_subscriber, stop_bridge
from harness.processes import free_port, port_open, wait_for
from tests.syslog_support import landed_once, run_id, start_syslog, tls_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RSYSLOGD = shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if os.path.exists("/usr/sbin/rsyslogd") else None)
SYSLOG_NG_ROOT = Path(__file__).parent / "syslog-ng"
SYSLOG_NG = SYSLOG_NG_ROOT / "usr/sbin/syslog-ng"
N = 300

needs_rsyslog = pytest.mark.skipif(RSYSLOGD is None, reason="rsyslog is not installed (make syslog-clients)")


@contextmanager
def daemon(argv: list[str], input_port: int, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A sender daemon in the foreground, up once its input port accepts; killed at the end."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{argv[0]} exited early:\n{proc.stdout.read() if proc.stdout else ''}")
            return port_open(input_port)

        wait_for(up, timeout=20, what=f"{Path(argv[0]).name} to listen")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(proc.stdout.read() if proc.stdout else "")


def send_lines(port: int, run: str, n: int, tag: str = "interop", start: int = 0) -> None:
    """n LF-framed 3164 lines into a daemon's own TCP input."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"".join(b"<133>%b[42]: run %b %d\n" % (tag.encode(), run.encode(), i)
                           for i in range(start, start + n)))


def rsyslog(tmp_path: Path, input_port: int, action: str, globals_: str = "", modules: str = "") -> list[str]:
    work = tmp_path / "rsyslog"
    work.mkdir(exist_ok=True)
    conf = work / "rsyslog.conf"
    conf.write_text(f"""
global(workDirectory="{work}" {globals_})
module(load="imtcp")
{modules}
input(type="imtcp" address="127.0.0.1" port="{input_port}" ruleset="fwd")
ruleset(name="fwd") {{
  {action}
}}
""")
    return [RSYSLOGD, "-n", "-f", str(conf), "-i", str(work / "rsyslogd.pid")]


QUEUE = ('queue.type="LinkedList" queue.size="10000" action.resumeRetryCount="-1" action.resumeInterval="1" '
         'template="RSYSLOG_SyslogProtocol23Format"')


def check_rsyslog_fields(body: dict, protocol_version: str) -> None:
    s = body["syslog"]
    assert (s["format"], s["facility"], s["severity"], s["app_name"], s["procid"]) == ("rfc5424", 16, 5, "interop", "42")
    assert body["@metadata"]["protocol_version"] == protocol_version
    assert not body["message"].endswith("\n")


@needs_rsyslog
def test_rsyslog_omfwd_octet_counted(device, tmp_path) -> None:
    b = start_syslog(device.router)
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        port, run = free_port(), run_id()
        action = f'action(type="omfwd" target="127.0.0.1" port="{b.port}" protocol="tcp" TCP_Framing="octet-counted" {QUEUE})'
        with daemon(rsyslog(tmp_path, port, action), port):
            send_lines(port, run, N)
            bodies = landed_once(sub, b.app_env, run, N)
        check_rsyslog_fields(bodies[0], "rfc6587")
        assert {x["@metadata"]["framing"] for x in bodies} == {"octet-counting"}
        sub.close()
    finally:
        stop_bridge(b)


@needs_rsyslog
def test_rsyslog_omfwd_tls(device, certs, tmp_path) -> None:
    b = start_syslog(device.router, *tls_flags(certs))
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        port, run = free_port(), run_id()
        action = (f'action(type="omfwd" target="127.0.0.1" port="{b.port}" protocol="tcp" TCP_Framing="octet-counted" '
                  f'StreamDriver="ossl" StreamDriverMode="1" StreamDriverAuthMode="x509/name" '
                  f'StreamDriverPermittedPeers="localhost" {QUEUE})')
        tls = f'DefaultNetstreamDriver="ossl" DefaultNetstreamDriverCAFile="{certs.ca}"'
        with daemon(rsyslog(tmp_path, port, action, tls), port):
            send_lines(port, run, N)
            bodies = landed_once(sub, b.app_env, run, N)
        check_rsyslog_fields(bodies[0], "rfc6587")
        assert bodies[0]["@metadata"]["tls"]["version"].startswith("TLS")
        sub.close()
    finally:
        stop_bridge(b)


OMRELP = 'module(load="omrelp")'


def relp_action(port: int, timeout: int = 90) -> str:
    return f'action(type="omrelp" target="127.0.0.1" port="{port}" timeout="{timeout}" {QUEUE})'


@needs_rsyslog
def test_rsyslog_omrelp(device, tmp_path) -> None:
    b = start_syslog(device.router, "--relp")
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        port, run = free_port(), run_id()
        with daemon(rsyslog(tmp_path, port, relp_action(b.port), modules=OMRELP), port):
            send_lines(port, run, N)
            bodies = landed_once(sub, b.app_env, run, N)
        check_rsyslog_fields(bodies[0], "relp")
        sub.close()
    finally:
        stop_bridge(b)


@needs_rsyslog
def test_rsyslog_omrelp_resends_across_a_stopped_device(device, tmp_path) -> None:
    """The device stops (SIGSTOP) longer than omrelp's 2 s timeout while rsyslog sends: no rsp
    comes, rsyslog drops the session, reconnects and sends the unanswered frames again. After
    SIGCONT every message lands: nothing is lost, copies are allowed (at-least-once)."""
    b = start_syslog(device.router, "--relp")
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        port, run = free_port(), run_id()
        with daemon(rsyslog(tmp_path, port, relp_action(b.port, timeout=2), modules=OMRELP), port):
            send_lines(port, run, 50)
            landed_once(sub, b.app_env, run, 50)
            os.kill(device.proc.pid, signal.SIGSTOP)
            try:
                send_lines(port, run, N - 50, start=50)
                time.sleep(6)  # three omrelp timeouts: it gave up on the session and reconnected
            finally:
                os.kill(device.proc.pid, signal.SIGCONT)
            got = collect(sub, b.app_env, N - 50, timeout=60)
            got += [(m, m.json()) for m in no_more(sub, b.app_env, 5.0)]
        numbers = [int(body["message"].rsplit(" ", 1)[1]) for _, body in got if f"run {run} " in body["message"]]
        assert set(numbers) == set(range(50, N)), f"lost: {sorted(set(range(50, N)) - set(numbers))[:20]}"
        print(f"{len(numbers) - (N - 50)} copies after the resend")
        assert len(numbers) > N - 50, "rsyslog sent nothing again: the session did not break"
        sub.close()
    finally:
        stop_bridge(b)


@pytest.mark.skipif(not SYSLOG_NG.exists(), reason="syslog-ng is not unpacked (make syslog-clients)")
@pytest.mark.parametrize("driver", ["syslog", "network"])
def test_syslog_ng(device, tmp_path, driver: str) -> None:
    """syslog-ng's syslog() driver: 5424 with octet counting; network(): LF-framed 3164."""
    b = start_syslog(device.router)
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        port, run = free_port(), run_id()
        work = tmp_path / "syslog-ng"
        work.mkdir()
        conf = work / "syslog-ng.conf"
        conf.write_text(f"""@version: 3.38
options {{ stats_freq(0); }};
source s_in {{ network(ip("127.0.0.1") port({port}) transport("tcp") flags(syslog-protocol)); }};
destination d_out {{ {driver}("127.0.0.1" port({b.port}) transport("tcp")); }};
log {{ source(s_in); destination(d_out); }};
""")
        root = SYSLOG_NG_ROOT
        argv = [str(SYSLOG_NG), "-F", "-f", str(conf), "-p", str(work / "syslog-ng.pid"),
                "-R", str(work / "syslog-ng.persist"), "-c", str(work / "syslog-ng.ctl"),
                f"--module-path={root}/usr/lib/syslog-ng/3.38", "--no-caps"]
        with daemon(argv, port, env={"LD_LIBRARY_PATH": f"{root}/usr/lib/syslog-ng"}):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"".join(b"<133>1 2026-11-27T10:00:00Z h interop 42 - - run %b %d\n" % (run.encode(), i)
                                   for i in range(N)))
            bodies = landed_once(sub, b.app_env, run, N)
        s = bodies[0]["syslog"]
        assert (s["format"], s["app_name"], s["procid"]) == (
            "rfc5424" if driver == "syslog" else "rfc3164", "interop", "42")
        assert {x["@metadata"]["framing"] for x in bodies} == {"octet-counting" if driver == "syslog" else "lf"}
        sub.close()
    finally:
        stop_bridge(b)
