"""`logjam-send` as a subprocess against a real `logjam-device` and real `logjam-bridge` processes.

A subscriber on the device's PUB checks that every line arrived once with the right
body; failures (nothing listening, the device answering 400, a TLS peer refusing us)
must give a non-zero exit and a clear message."""

from __future__ import annotations

import json

import signal
import subprocess
import uuid
from typing import Any

import pytest

from tests.bridge_support import collect, no_more, ready_subscriber, start_bridge, stop_bridge
from harness.processes import command, free_port

SEND = command("logjam-send")


def send(*args: str, stdin: str = "", timeout: float = 30) -> subprocess.CompletedProcess:
    # start_device's devices run without CURVE (tests/test_curve.py has it): --plaintext for the logjam protocol.
    plain = ["--plaintext"] if args[:1] == ("logjam",) else []
    return subprocess.run([SEND, *args, *plain], input=stdin, capture_output=True, text=True, timeout=timeout)


def bodies(sub, app_env: str, n: int) -> list[dict[str, Any]]:
    got = [{k: v for k, v in body.items() if k != "@metadata"} for _, body in collect(sub, app_env, n)]
    assert no_more(sub, app_env, 0.3) == []
    return got


def key(body: dict[str, Any]) -> str:
    return repr(sorted(body.items()))


ARG_LINES = ["plain line one", '{"message": "from json", "level": "warn", "n": 3}', "plain line two"]
STDIN_TEXT = "stdin a\r\n\n{\"message\": \"stdin json\", \"tags\": [\"x\"]}\n[1, 2]\nstdin b"  # no final newline
STDIN_EVENTS = [{"message": "stdin a"}, {"message": "stdin json", "tags": ["x"]}, {"message": "[1, 2]"}, {"message": "stdin b"}]
ARG_EVENTS = [{"message": "plain line one"}, {"message": "from json", "level": "warn", "n": 3}, {"message": "plain line two"}]


def as_v1(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lumberjack v1 carries strings: nested values arrive as their JSON text."""
    import json

    return [{k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for k, v in e.items()} for e in events]


@pytest.mark.timeout(60)
def test_logjam_dealer_arguments_and_stdin(device) -> None:
    app_env = f"sendtest-{uuid.uuid4().hex[:8]}"
    sub = ready_subscriber(device.pub, device.router, app_env)
    try:
        r = send("logjam", "--to", f"127.0.0.1:{device.router_port}", "--app-env", app_env, *ARG_LINES)
        assert r.returncode == 0, r.stderr
        assert "3 events sent to logjam" in r.stderr and "acknowledged" in r.stderr
        # '-' splices stdin in between arguments.
        r = send("logjam", "--to", f"127.0.0.1:{device.router_port}", "--app-env", app_env,
                 "--topic", "logs.send.test", "--compress", "lz4", "first", "-", "last", stdin=STDIN_TEXT)
        assert r.returncode == 0, r.stderr
        got = collect(sub, app_env, 3 + 6)
        assert [m.topic for m, _ in got] == ["logs.send"] * 3 + ["logs.send.test"] * 6
        assert [b for _, b in got] == ARG_EVENTS + [{"message": "first"}, *STDIN_EVENTS, {"message": "last"}]
        assert no_more(sub, app_env, 0.3) == []
    finally:
        sub.close()


@pytest.mark.timeout(60)
def test_stdin_lines_go_out_as_they_arrive_and_sigterm_flushes(device) -> None:
    """`tail -f | logjam-send`: a line is sent while stdin stays open; SIGTERM ends cleanly."""
    app_env = f"sendtest-{uuid.uuid4().hex[:8]}"
    sub = ready_subscriber(device.pub, device.router, app_env)
    proc = subprocess.Popen([SEND, "logjam", "--plaintext", "--to", f"127.0.0.1:{device.router_port}", "--app-env", app_env],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in ("first", "second"):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            assert [b for _, b in collect(sub, app_env, 1, timeout=10)] == [{"message": line}]
        proc.stdin.write("last\n")
        proc.stdin.flush()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert "3 events sent to logjam" in proc.stderr.read()
        assert [b for _, b in collect(sub, app_env, 1, timeout=10)] == [{"message": "last"}]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stderr.close()
        sub.close()


@pytest.mark.timeout(60)
def test_logjam_push_sends_without_acknowledgement(device) -> None:
    app_env = f"sendtest-{uuid.uuid4().hex[:8]}"
    sub = ready_subscriber(device.pub, device.router, app_env)
    try:
        r = send("logjam", "--mode", "push", "--to", f"127.0.0.1:{device.pull_port}", "--app-env", app_env, stdin=STDIN_TEXT)
        assert r.returncode == 0, r.stderr
        assert "not acknowledged" in r.stderr
        assert sorted(map(key, bodies(sub, app_env, 4))) == sorted(map(key, STDIN_EVENTS))
    finally:
        sub.close()
    assert "cannot be acknowledged" in " ".join(send("--help").stdout.split())


@pytest.mark.timeout(60)
def test_logjam_device_400_exits_nonzero(device) -> None:
    r = send("logjam", "--to", f"127.0.0.1:{device.router_port}", "--topic", "bogus.topic", "refused")
    assert r.returncode == 1, r.stderr
    assert "400 Bad Request" in r.stderr and "--topic 'bogus.topic'" in r.stderr
    assert "0 of 1 events acknowledged" in r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", ["logjam", "lumberjack", "courier", "segment", "rustlog", "otlp", "syslog"])
def test_nothing_listening_exits_nonzero(protocol: str) -> None:
    port = free_port()
    r = send(protocol, "--to", f"127.0.0.1:{port}", "--timeout", "1", "hello")
    assert r.returncode == 1, r.stderr
    if protocol == "logjam":  # ZeroMQ connects lazily: the request goes unanswered
        assert "got no reply" in r.stderr
    else:
        assert f"cannot connect to 127.0.0.1:{port}" in r.stderr
    assert "0 of 1 events acknowledged" in r.stderr


BRIDGE_CASES = {
    "lumberjack-v2": ("lumberjack", []),
    "lumberjack-v1": ("lumberjack", ["--lumberjack-version", "1"]),
    "courier": ("courier", []),
    "segment": ("segment", ["--segment", "send/test/0.#epoch.0"]),
    "rustlog-json-partition-1": ("rustlog", ["--rustlog-topic", "send-test", "--partition", "1"]),
    "rustlog-binary": ("rustlog", ["--dialect", "binary"]),
    "syslog-relp": ("syslog", []),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("protocol,flags", list(BRIDGE_CASES.values()), ids=list(BRIDGE_CASES))
def test_bridge_protocols_arguments_and_stdin(device, tmp_path, protocol: str, flags: list[str]) -> None:
    b = start_bridge(protocol, device.router, *(["--relp"] if protocol == "syslog" else []),
                     data_dir=tmp_path / protocol if protocol in ("segment", "rustlog") else None)
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        # The first run creates the segment or topic; the second finds it.
        r = send(protocol, "--to", b.to, *flags, *ARG_LINES)
        assert r.returncode == 0, r.stderr
        assert f"3 events sent to {protocol} {b.to} and acknowledged" in r.stderr
        # stdin in two batches, so a second window/payload/append/request follows the first.
        r = send(protocol, "--to", b.to, "--batch-size", "2", *flags, stdin=STDIN_TEXT)
        assert r.returncode == 0, r.stderr
        expected = ARG_EVENTS + STDIN_EVENTS
        if "1" in flags and protocol == "lumberjack":
            expected = as_v1(expected)
        got = bodies(sub, b.app_env, 7)
        if protocol == "syslog":  # one RFC 5424 line each: MSG is the line, or the JSON object's text
            expected = [{"message": e["message"] if len(e) == 1 else json.dumps(e, separators=(",", ":"))}
                        for e in expected]
            assert {g["syslog"]["app_name"] for g in got} == {"logjam-send"}
            got = [{"message": g["message"]} for g in got]
        assert sorted(map(key, got)) == sorted(map(key, expected))
    finally:
        sub.close()
        stop_bridge(b)


@pytest.mark.timeout(90)
def test_otlp_over_http_with_a_service_and_environment(device) -> None:
    b = start_bridge("otlp", device.router, "--grpc-listen", f"127.0.0.1:{free_port()}")
    sub = ready_subscriber(device.pub, device.router, "shop-test")
    fallback = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        r = send("otlp", "--to", b.to, "--service", "shop", "--environment", "test", *ARG_LINES)
        assert r.returncode == 0, r.stderr
        assert f"3 events sent to otlp {b.to} and acknowledged" in r.stderr
        got = [m.json() for m in _messages(sub, "shop-test", 3)]
        # A line's message is the record's body; its other fields are the record's attributes.
        assert sorted(body.get("message", "") for body in got) == sorted(e.get("message", "") for e in ARG_EVENTS)
        assert all(body["scope"] == {"name": "logjam-send"} for body in got)
        assert [body["attributes"] for body in got if body["message"] == "from json"] == [{"level": "warn", "n": 3}]
        # Without --service the bridge's --app-env names the stream.
        r = send("otlp", "--to", b.to, "no service")
        assert r.returncode == 0, r.stderr
        assert [m.json()["message"] for m in _messages(fallback, b.app_env, 1)] == ["no service"]
    finally:
        sub.close()
        fallback.close()
        stop_bridge(b)


def _messages(sub, app_env: str, n: int) -> list:
    return [m for m, _ in collect(sub, app_env, n)]


@pytest.mark.timeout(90)
def test_tls_and_mutual_tls(device, tmp_path, certs) -> None:
    server = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    # TLS: verified against the test CA.
    b = start_bridge("courier", device.router, *server)
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        r = send("courier", "--to", b.to, "--tls-ca", str(certs.ca), "over tls")
        assert r.returncode == 0, r.stderr
        assert bodies(sub, b.app_env, 1) == [{"message": "over tls"}]
        # Without the CA the server is not trusted: refused, nothing sent.
        r = send("courier", "--to", b.to, "--tls", "--timeout", "5", "untrusted")
        assert r.returncode == 1 and "TLS handshake" in r.stderr and "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr
    finally:
        sub.close()
        stop_bridge(b)
    # Mutual TLS: the bridge requires a client certificate signed by the test CA.
    b = start_bridge("lumberjack", device.router, *server, "--tls-client-ca", str(certs.ca))
    sub = ready_subscriber(device.pub, device.router, b.app_env)
    try:
        r = send("lumberjack", "--to", b.to, "--tls-ca", str(certs.ca),
                 "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key), stdin="mutual\n")
        assert r.returncode == 0, r.stderr
        got = collect(sub, b.app_env, 1)
        assert got[0][1]["message"] == "mutual"
        assert got[0][1]["@metadata"]["tls"]["cn"] == "test-client"
        r = send("lumberjack", "--to", b.to, "--tls-ca", str(certs.ca), "--timeout", "5", "no client cert")
        assert r.returncode == 1, r.stderr
        assert "client certificate" in r.stderr or "TLS handshake" in r.stderr  # TLS 1.3 or 1.2
        assert "0 of 1 events acknowledged" in r.stderr
        assert no_more(sub, b.app_env, 0.3) == []
    finally:
        sub.close()
        stop_bridge(b)
