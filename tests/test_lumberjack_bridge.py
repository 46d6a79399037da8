"""`logjam-bridge lumberjack` over real sockets, with a real `logjam-device` and a subscriber:
N events in, N Logjam messages out (body, @metadata, app-env, created_ms); acks; TCP,
TLS, mutual TLS; garbage next to a good client; the device paused.

Every test with a device runs twice, under LOGJAM_NATIVE=require (the bridge's C scanner and
device link, the device's C loop) and off (their Python twins): `native_device` is on each. The one
without (limits refused at start, before a scanner exists) runs once."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid

import pytest

from bridges.lumberjack.bridge import FEED_SLICE
from bridges.lumberjack.engine import V1, AckFrame, LumberjackClient, encode_data_frame, encode_window
from logjam.validation import is_valid_app_env
from harness.processes import command, wait_for
from tests.bridge_support import client_tls, collect, no_more, read_replies, ready_subscriber, send_unless_halted, stop_bridge
from tests.lumberjack_support import start_lumberjack

# Native-sensitive (LOGJAM_NATIVE picks the C path or its Python twin): `native_device` runs on both.
pytestmark = pytest.mark.native


def connect(port: int, ctx: ssl.SSLContext | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    if ctx is not None:
        sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def read_acks_until(sock: socket.socket, client: LumberjackClient, seq: int, timeout: float = 20) -> list[AckFrame]:
    """Every ack up to and including the one for `seq` (keepalives included)."""
    acks: list[AckFrame] = []
    deadline = time.monotonic() + timeout
    while not acks or acks[-1].seq != seq:
        assert time.monotonic() < deadline, f"no ack for {seq}; got {acks}"
        data = sock.recv(65536)
        assert data, f"connection closed before the ack for {seq}; got {acks}"
        acks += client.feed(data)
    return acks


def send_window(sock: socket.socket, client: LumberjackClient, events: list) -> list[AckFrame]:
    sock.sendall(client.send(events))
    return read_acks_until(sock, client, client.last_seq)


def tagged(n: int, run: str, start: int = 0) -> list[dict]:
    return [
        {"message": f"event {i}", "run": run, "n": i, "@timestamp": f"2024-05-01T12:00:{i % 60:02d}.250Z",
         "@metadata": {"beat": "filebeat"}}
        for i in range(start, start + n)
    ]


@pytest.fixture
def bridge(native_device):
    b = start_lumberjack(native_device.router)
    yield b
    stop_bridge(b)


@pytest.mark.timeout(90)
def test_v2_events_arrive_once_with_body_metadata_and_app_env(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    client = LumberjackClient()  # counts across windows, like pylogbeat
    run = uuid.uuid4().hex
    with connect(bridge.port) as sock:
        for w in range(3):
            acks = send_window(sock, client, tagged(100, run, start=w * 100))
            assert acks[-1] == AckFrame(0x32, (w + 1) * 100)
        local = "%s:%d" % sock.getsockname()[:2]
    got = collect(sub, bridge.app_env, 300)
    assert no_more(sub, bridge.app_env, 0.5) == []
    assert sorted(body["n"] for _, body in got) == list(range(300))
    msg, body = got[0]
    assert msg.topic == "logs.lumberjack"
    assert body["message"] == f"event {body['n']}" and body["run"] == run
    meta = body["@metadata"]
    assert meta["beat"] == "filebeat"  # the client's own @metadata is kept
    assert meta["protocol"] == "lumberjack" and meta["protocol_version"] == "2"
    assert meta["peer"] == local
    assert meta["seq"] == body["n"] + 1
    assert abs(meta["received_at"] - time.time() * 1000) < 60_000
    assert "tls" not in meta
    # created_ms is the event's @timestamp.
    n = body["n"]
    assert msg.meta.created_ms == 1714564800250 + (n % 60) * 1000
    sub.close()


@pytest.mark.timeout(90)
def test_windows_larger_than_a_batch_arrive_whole_and_in_order(native_device) -> None:
    """One C frame of 1000 events is split into batches of 128: every event once, in order,
    each with its own seq and key, plain objects and the events C hands to Python alike."""
    bridge = start_lumberjack(native_device.router, "--batch-size", "128")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
        client = LumberjackClient(restart_each_window=True)
        run = uuid.uuid4().hex
        events: list = []
        for i in range(1000):
            if i % 97 == 5:
                events.append(b'"a JSON string, not an object"')
            elif i % 97 == 50:
                events.append(b'{"n": %d, "broken": ' % i)  # not JSON: kept as text
            else:
                events.append({"n": i, "run": run, "@timestamp": f"2024-05-01T12:00:{i % 60:02d}.250Z"})
        with connect(bridge.port) as sock:
            for _ in range(2):
                acks = send_window(sock, client, events)
                assert acks[-1] == AckFrame(0x32, 1000)
        got = collect(sub, bridge.app_env, 2000)
        assert no_more(sub, bridge.app_env, 0.5) == []
    finally:
        stop_bridge(bridge)
    assert [body["@metadata"]["seq"] for _, body in got] == list(range(1, 1001)) * 2
    for i, (msg, body) in enumerate(got[:1000]):
        if i % 97 == 5:
            assert body["message"] == '"a JSON string, not an object"'
        elif i % 97 == 50:
            assert body["message"] == '{"n": %d, "broken": ' % i
        else:
            assert body["n"] == i and body["run"] == run
            assert msg.meta.created_ms == 1714564800250 + (i % 60) * 1000
    keys = [body["@metadata"]["_id"] for _, body in got]
    assert len(set(keys)) == 2000
    sub.close()


@pytest.mark.timeout(60)
def test_v1_string_maps_line_becomes_message_and_acks_are_version_1(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    client = LumberjackClient(version=V1, compress_level=None)
    with connect(bridge.port) as sock:
        acks = send_window(sock, client, [{"line": f"line {i}", "host": "web1", "offset": str(i)} for i in range(20)])
    assert all(a.version == V1 for a in acks)
    got = collect(sub, bridge.app_env, 20)
    bodies = sorted((b for _, b in got), key=lambda b: int(b["offset"]))
    assert bodies[3]["message"] == "line 3" and "line" not in bodies[3]
    assert bodies[3]["host"] == "web1"
    assert bodies[3]["@metadata"]["protocol_version"] == "1"
    sub.close()


@pytest.mark.timeout(60)
def test_partial_windows_restart_numbering_and_empty_window(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    client = LumberjackClient(restart_each_window=True)  # Filebeat numbers each window from 1
    with connect(bridge.port) as sock:
        # W 10 announced, only 4 events sent (end of a batch): the 4 must still be acked.
        frames = client.send([{"message": f"a{i}"} for i in range(4)])
        sock.sendall(encode_window(10) + frames[6:])
        assert read_acks_until(sock, client, 4)[-1].seq == 4
        assert send_window(sock, client, [{"message": f"b{i}"} for i in range(3)])[-1].seq == 3
        # W 0 is answered with ack 0.
        sock.sendall(encode_window(0))
        assert client.feed(sock.recv(6)) == [AckFrame(0x32, 0)]
    got = collect(sub, bridge.app_env, 7)
    assert sorted(b["message"] for _, b in got) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
    sub.close()


@pytest.mark.timeout(60)
def test_app_env_field_overrides_and_falls_back(native_device) -> None:
    b = start_lumberjack(native_device.router, "--app-env-field", "fields.service")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, "shop-prod")
        client = LumberjackClient()
        with connect(b.port) as sock:
            send_window(sock, client, [{"message": "x", "fields": {"service": "shop-prod"}}, {"message": "y"}])
        (msg, body), = collect(sub, "shop-prod", 1)
        assert body["message"] == "x" and is_valid_app_env(msg.app_env)
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- TLS


@pytest.mark.timeout(60)
def test_tls(native_device, certs) -> None:
    b = start_lumberjack(native_device.router, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        client = LumberjackClient()
        with connect(b.port, client_tls(certs)) as sock:
            send_window(sock, client, [{"message": f"m{i}"} for i in range(50)])
        got = collect(sub, b.app_env, 50)
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["version"] in ("TLSv1.2", "TLSv1.3") and tls["cipher"]
        assert tls["cn"] is None  # no client certificate asked for
        # Plain TCP to a TLS port gets nothing acknowledged.
        with connect(b.port) as plain:
            plain.sendall(LumberjackClient().send([{"message": "plain"}]))
            try:
                assert plain.recv(6)[:2] != b"2A"
            except ConnectionError:
                pass
        assert no_more(sub, b.app_env, 0.5) == []
        sub.close()
    finally:
        stop_bridge(b)


def _refused(port: int, ctx: ssl.SSLContext) -> bool:
    """True when the bridge ends the connection without acknowledging anything."""
    try:
        with connect(port, ctx) as sock:
            sock.sendall(LumberjackClient().send([{"message": "intruder"}]))
            return sock.recv(6) == b""
    except (ssl.SSLError, ConnectionError):
        return True


@pytest.mark.timeout(60)
def test_mutual_tls_and_refusals(native_device, certs) -> None:
    b = start_lumberjack(
        native_device.router, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
    )
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        client = LumberjackClient()
        with connect(b.port, client_tls(certs, cert=True)) as sock:
            send_window(sock, client, [{"message": f"m{i}"} for i in range(20)])
        got = collect(sub, b.app_env, 20)
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["cn"] == "test-client" and "test-client" in tls["subject"]
        assert _refused(b.port, client_tls(certs))  # no certificate
        assert _refused(b.port, client_tls(certs, other=True))  # certificate from a CA we do not trust
        assert no_more(sub, b.app_env, 0.5) == []
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------- bad peers


@pytest.mark.timeout(60)
def test_garbage_connections_next_to_a_good_one(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    client = LumberjackClient()
    window = client.send([{"message": f"g{i}"} for i in range(10)])
    with connect(bridge.port) as good:
        good.sendall(window[:20])  # part of a window first
        bad = [connect(bridge.port) for _ in range(4)]
        bad[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        bad[1].sendall(b"2J\x00\x00\x00\x01\xff\xff\xff\xff")  # a 4 GiB frame
        bad[2].sendall(b"2C\x00\x00\x00\x05hello")  # not zlib
        bad[3].sendall(b"\x00" + os.urandom(4095))  # never a valid version byte
        for s in bad:
            assert s.recv(100) == b""  # closed by the bridge, nothing acked
            s.close()
        good.sendall(window[20:])
        assert read_acks_until(good, client, 10)[-1].seq == 10
    got = collect(sub, bridge.app_env, 10)
    assert sorted(b["message"] for _, b in got) == sorted(f"g{i}" for i in range(10))
    sub.close()


# ---------------------------------------------------------------- device paused


@pytest.mark.timeout(120)
def test_device_paused_no_ack_flat_memory_then_everything_once(native_device) -> None:
    b = start_lumberjack(native_device.router)
    sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
    stopped = False
    halt = threading.Event()  # stops the sender
    done = threading.Event()  # stops the ack reader
    try:
        # Like npm lumberjack-protocol: one W 1000, then D frames forever, reading acks as they come.
        sock = connect(b.port)
        sock.settimeout(0.5)
        acks: list[AckFrame] = []
        ack_client = LumberjackClient(version=V1)
        sent = 0
        last_progress = time.monotonic()

        def progressed() -> None:
            nonlocal last_progress
            last_progress = time.monotonic()

        def pump() -> None:
            nonlocal sent
            sock.sendall(encode_window(1000, V1))
            pad = "x" * 150
            while not halt.is_set():
                if send_unless_halted(sock, encode_data_frame(sent + 1, {"line": f"p{sent + 1}", "pad": pad}), halt, progressed):
                    sent += 1

        # Everything flows while the device runs.
        pump_thread = threading.Thread(target=pump, daemon=True)
        ack_thread = threading.Thread(target=read_replies, args=(sock, ack_client.feed, acks, lambda: not done.is_set()), daemon=True)
        pump_thread.start()
        ack_thread.start()
        wait_for(lambda: acks and acks[-1].seq > 1000, timeout=30, what="acks while the device runs")

        os.kill(native_device.proc.pid, signal.SIGSTOP)
        stopped = True
        # The sender stalls once the bridge stops reading (its buffers are bounded).
        wait_for(lambda: time.monotonic() - last_progress > 1.5, timeout=40, interval=0, what="the sender to be back-pressured")
        highest = max(a.seq for a in acks)
        rss_stalled = b.rss_kib()
        n_acks = len(acks)
        # Keepalives keep coming (interval 0.5 s) but acknowledge nothing new.
        wait_for(lambda: len(acks) >= n_acks + 3, timeout=10, what="keepalive acks while paused")
        assert max(a.seq for a in acks) == highest
        assert sent > highest
        rss_later = b.rss_kib()
        assert rss_later - rss_stalled < 8 * 1024, (rss_stalled, rss_later)
        assert rss_later < 400 * 1024

        os.kill(native_device.proc.pid, signal.SIGCONT)
        stopped = False
        halt.set()
        pump_thread.join(5)
        total = sent
        wait_for(lambda: acks and acks[-1].seq == total, timeout=60, what=f"the ack for {total} (last acks {acks[-3:]})")
        got = collect(sub, b.app_env, total, timeout=60)
        lines = [body["message"] for _, body in got]
        assert len(set(lines)) == total == len(lines)
        assert no_more(sub, b.app_env, 0.5) == []
        done.set()
        ack_thread.join(5)
        sock.close()
        sub.close()
    finally:
        halt.set()
        done.set()
        if stopped:
            os.kill(native_device.proc.pid, signal.SIGCONT)
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_waiting_client_is_not_idle_while_the_device_is_paused(native_device) -> None:
    b = start_lumberjack(native_device.router, "--idle-timeout", "1")
    sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
    client = LumberjackClient()
    os.kill(native_device.proc.pid, signal.SIGSTOP)
    try:
        with connect(b.port) as sock:
            sock.sendall(client.send([{"message": f"w{i}"} for i in range(50)]))
            # Three idle timeouts pass while the client waits for our ack: only keepalives (0).
            deadline = time.monotonic() + 3
            seen: list[AckFrame] = []
            sock.settimeout(0.5)
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(100)
                except TimeoutError:
                    continue
                assert data, "the bridge closed a client that was waiting for acks"
                seen += client.feed(data)
            assert seen and all(a.seq == 0 for a in seen)
            os.kill(native_device.proc.pid, signal.SIGCONT)
            sock.settimeout(20)
            assert read_acks_until(sock, client, 50)[-1].seq == 50
        assert len(collect(sub, b.app_env, 50)) == 50
        sub.close()
    finally:
        os.kill(native_device.proc.pid, signal.SIGCONT)
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_sigterm_with_the_device_paused_acks_nothing_and_exits_0(native_device) -> None:
    b = start_lumberjack(native_device.router)
    client = LumberjackClient()
    os.kill(native_device.proc.pid, signal.SIGSTOP)
    try:
        with connect(b.port) as sock:
            sock.sendall(client.send([{"message": f"t{i}"} for i in range(100)]))
            sock.settimeout(10)
            seen = client.feed(sock.recv(6))  # a keepalive proves the events are held
            assert seen == [AckFrame(0x32, 0)]
            out = stop_bridge(b)  # asserts exit code 0
            rest = b""
            while chunk := sock.recv(4096):
                rest += chunk
            assert all(a.seq == 0 for a in client.feed(rest)), "acked events the device never accepted"
        assert "stopped" in out
    finally:
        os.kill(native_device.proc.pid, signal.SIGCONT)


def _metric(port: int, name: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.timeout(90)
def test_process_wide_bound_stops_reading_every_client(native_device) -> None:
    from harness.processes import free_port

    metrics_port = free_port()
    b = start_lumberjack(native_device.router, "--max-process-pending-events", "300", "--metrics-port", str(metrics_port))
    sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
    os.kill(native_device.proc.pid, signal.SIGSTOP)
    paused = True
    socks = []
    try:
        clients = [LumberjackClient(compress_level=None) for _ in range(3)]
        for k, client in enumerate(clients):
            sock = connect(b.port)
            # 2000 uncompressed ~30-byte events each: far beyond the bound, all in the socket.
            sock.sendall(client.send([{"message": f"c{k}-{i}"} for i in range(2000)]))
            socks.append(sock)
        received = "logjam_bridge_events_received_total"
        wait_for(lambda: _metric(metrics_port, received) >= 300, timeout=20, what="the bound to fill")
        # The bound is checked before each slice is decoded, so all connections together
        # overshoot it by one slice's worth of the smallest frames at most (~290 here).
        window = len(LumberjackClient(compress_level=None).send([]))
        smallest = len(LumberjackClient(compress_level=None).send([{"message": "c0-0"}])) - window
        assert _metric(metrics_port, received) <= 300 + FEED_SLICE // smallest
        os.kill(native_device.proc.pid, signal.SIGCONT)
        paused = False
        for sock, client in zip(socks, clients):
            assert read_acks_until(sock, client, 2000, timeout=60)[-1].seq == 2000
        assert len(collect(sub, b.app_env, 6000, timeout=60)) == 6000
        assert _metric(metrics_port, "logjam_bridge_events_acked_total") == 6000
        sub.close()
    finally:
        if paused:
            os.kill(native_device.proc.pid, signal.SIGCONT)
        for sock in socks:
            sock.close()
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_device_rejection_is_not_acked_and_closes_the_connection(native_device) -> None:
    b = start_lumberjack(native_device.router, "--topic", "not-a-logjam-topic")
    client = LumberjackClient()
    try:
        with connect(b.port) as sock:
            sock.sendall(client.send([{"message": "rejected"}] * 5))
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            assert all(a.seq == 0 for a in client.feed(data)), "acked events the device refused"
    finally:
        out = stop_bridge(b)
    assert "device rejected 5 of 5 messages; closing without ack" in out
    assert "Traceback" not in out


@pytest.mark.timeout(90)
def test_old_knob_names_still_work_with_one_warning_at_start(native_device) -> None:
    """--pipeline and --max-batch (now --pipeline-depth, --batch-size) are accepted for one release."""
    bridge = start_lumberjack(native_device.router, "--pipeline", "1", "--max-batch", "16")
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
        client = LumberjackClient(restart_each_window=True)
        with connect(bridge.port) as sock:
            for _ in range(2):
                assert send_window(sock, client, tagged(40, uuid.uuid4().hex))[-1] == AckFrame(0x32, 40)
        assert len(collect(sub, bridge.app_env, 80)) == 80
    finally:
        out = stop_bridge(bridge)
    for old, new in (("--pipeline", "--pipeline-depth"), ("--max-batch", "--batch-size")):
        assert out.count(f"{old} is deprecated and will be removed in the next release; use {new}") == 1, out


@pytest.mark.timeout(60)
def test_limits_beyond_32_bits_are_refused_at_start() -> None:
    proc = subprocess.run(
        [command("logjam-bridge"), "lumberjack", "--listen", "127.0.0.1:0", "--max-decompressed-size", str(2**32),
             "--plaintext"],
        capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode != 0
    assert "decompressed size limits must be between 1 and 2^32-1 bytes" in proc.stderr
