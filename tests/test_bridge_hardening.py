"""Hostile clients against a real `logjam-bridge lumberjack` (the limits live in the shared
host, so every bridge has them): zip bombs and RSS, idle floods and slowloris clients next
to a real client (pylogbeat), the per-peer limit, and refused TLS handshakes in the log
and the metrics."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from bridges.lumberjack.engine import LumberjackClient
from tests.bridge_support import BridgeProcess, collect, ready_subscriber, start_bridge, stop_bridge
from harness.processes import free_port, wait_for
from tests.lumberjack_support import start_lumberjack
from tests.test_device_helpers import scrape


def metric(port: int, name: str, protocol: str = "lumberjack", **labels: str) -> float:
    want = tuple(sorted({"protocol": protocol, **labels}.items()))
    return scrape(port).get((name, want), 0.0)


def deflate_stream(block: bytes, repeat: int) -> bytes:
    c = zlib.compressobj(9)
    return b"".join(c.compress(block) for _ in range(repeat)) + c.flush()


def c_frame(body: bytes) -> bytes:
    return b"2C" + struct.pack(">I", len(body)) + body


@contextmanager
def sampling_rss(bridge: BridgeProcess) -> Iterator[list[int]]:
    """Samples the bridge's RSS (KiB) every 10 ms while the block runs."""
    samples = [bridge.rss_kib()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(bridge.rss_kib())
            done.wait(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield samples
    finally:
        done.set()
        t.join()


# ---------------------------------------------------------------------------- zip bombs


@pytest.mark.timeout(120)
def test_concurrent_zip_bombs_do_not_grow_rss(device) -> None:
    # Four 1 MiB C frames inflating to 1 GiB of zeros and four inflating to valid J frames
    # past the 64 MiB limit, all at once. On main this grew RSS by 344 MiB and kept it.
    zeros = c_frame(deflate_stream(bytes(1 << 20), 1024))
    j = b"2J" + struct.pack(">II", 1, 2) + b"{}"
    frames = c_frame(deflate_stream(j * 65536, 110))  # 1,100 x 768 KiB = 82 MiB of J frames
    assert len(zeros) < 1_100_000 and len(frames) < 2_000_000
    mport = free_port()
    b = start_lumberjack(device.router, "--metrics-port", str(mport))
    try:
        wait_for(lambda: scrape(mport), timeout=10, what="metrics")
        before = b.rss_kib()
        socks = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(8)]
        with sampling_rss(b) as samples:
            senders = [threading.Thread(target=s.sendall, args=(zeros if i < 4 else frames,)) for i, s in enumerate(socks)]
            for t in senders:
                t.start()

            def refused() -> bool:
                return (metric(mport, "logjam_bridge_protocol_errors_total", reason="bad_compressed_payload") == 4
                        and metric(mport, "logjam_bridge_protocol_errors_total", reason="decompressed_too_large") == 4)

            wait_for(refused, timeout=60, what="all eight bombs refused")
            for t in senders:
                t.join()
        after = b.rss_kib()
        for s in socks:
            s.close()
        growth_peak, growth_after = (max(samples) - before) >> 10, (after - before) >> 10
        print(f"RSS before {before >> 10} MiB, peak +{growth_peak} MiB, after +{growth_after} MiB")
        assert growth_peak < 120, f"peak grew by {growth_peak} MiB"
        assert growth_after < 32, f"RSS stayed {growth_after} MiB higher"
    finally:
        stop_bridge(b)


def send_windows(port: int, windows: int, per_window: int, run: str, who: int) -> int:
    """A compressing Lumberjack v2 client: `windows` windows, each read until its ack; the last seq acked."""
    client = LumberjackClient(compress_level=1)
    acked = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for w in range(windows):
            events = [{"message": "x" * 2000, "run": run, "who": who, "n": w * per_window + i} for i in range(per_window)]
            s.sendall(client.send(events))
            while acked != client.last_seq:
                data = s.recv(4096)
                assert data, "the bridge closed the connection"
                for ack in client.feed(data):
                    acked = ack.seq
    return acked


@pytest.mark.timeout(120)
def test_connections_wait_for_the_inflate_budget_rather_than_fail(device) -> None:
    # A budget smaller than one window's inflated size: every C frame overshoots it, so each
    # connection waits until the others' events are acked, and every event still lands.
    mport = free_port()
    b = start_lumberjack(device.router, "--metrics-port", str(mport), "--max-inflated-bytes", "100000")
    try:
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        run = uuid.uuid4().hex
        results: list[int] = []
        clients = [threading.Thread(target=lambda who=who: results.append(send_windows(b.port, 5, 200, run, who)))
                   for who in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(90)
        assert results == [1000] * 4
        got = [body for _, body in collect(sub, b.app_env, 4000) if body.get("run") == run]
        assert sorted((body["who"], body["n"]) for body in got) == [(w, n) for w in range(4) for n in range(1000)]
        assert metric(mport, "logjam_bridge_inflate_waits_total") > 0
        wait_for(lambda: metric(mport, "logjam_bridge_inflated_bytes") == 0, what="the budget to be refunded")
        sub.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------------------- slowloris and floods


def open_idle(port: int, n: int, sources: list[str]) -> list[socket.socket]:
    out = []
    for i in range(n):
        out.append(socket.create_connection(("127.0.0.1", port), source_address=(sources[i % len(sources)], 0)))
    return out


def slowloris(port: int, stop: threading.Event, payload: bytes, interval: float = 1.0) -> socket.socket:
    """Connects, then sends `payload` one byte per `interval` (never finishing its frame)."""
    s = socket.create_connection(("127.0.0.1", port))

    def drip() -> None:
        for byte in payload:
            if stop.wait(interval):
                return
            try:
                s.send(bytes([byte]))
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()
    return s


def closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        data = s.recv(65536)
        while data:  # keepalive acks: read past them
            data = s.recv(65536)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.timeout(180)
def test_idle_flood_and_slowloris_do_not_lock_out_a_real_client(device) -> None:
    import pylogbeat

    mport = free_port()
    b = start_lumberjack(device.router, "--metrics-port", str(mport), "--frame-timeout", "5",
                         "--shed-idle-after", "2", "--idle-timeout", "60")
    stop = threading.Event()
    with ExitStack() as cleanup:
        cleanup.callback(stop_bridge, b)
        cleanup.callback(stop.set)
        sub = ready_subscriber(device.pub, device.router, b.app_env)
        cleanup.callback(sub.close)
        # 2,000 connections that never say anything, from eight loopback addresses (under
        # the default 256 per peer), against the default --max-connections 1024.
        idle = open_idle(b.port, 2000, [f"127.0.0.{i}" for i in range(2, 10)])
        cleanup.callback(lambda: [s.close() for s in idle])
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") >= 1000, timeout=30, what="the flood to be open")
        time.sleep(2.5)  # let the flood become idle for --shed-idle-after (a duration under test, not a condition)
        # 20 slowloris clients: ten drip a J frame header, ten a C frame, a byte a second.
        j_header = b"2W\x00\x00\x00\x01" + b"2J" + struct.pack(">II", 1, 100)
        c_part = b"2C" + struct.pack(">I", 1000) + bytes(100)
        loris = [slowloris(b.port, stop, j_header if i % 2 else c_part) for i in range(20)]
        cleanup.callback(lambda: [s.close() for s in loris])
        # A real client still gets in and gets every ack within 5 s.
        run = uuid.uuid4().hex
        started = time.monotonic()
        client = pylogbeat.PyLogBeatClient("127.0.0.1", b.port, ssl_enable=False, timeout=5)
        with client:
            for start in range(0, 60, 20):
                client.send([{"message": f"real {i}", "run": run, "n": i} for i in range(start, start + 20)])
        elapsed = time.monotonic() - started
        print(f"pylogbeat: 3 windows acked in {elapsed:.2f}s next to {metric(mport, 'logjam_bridge_connections_active'):.0f}"
              f" open connections, {metric(mport, 'logjam_bridge_connections_shed_total'):.0f} shed,"
              f" {metric(mport, 'logjam_bridge_connections_refused_total'):.0f} refused")
        assert client._last_ack == 60
        assert elapsed < 5, f"the real client took {elapsed:.1f}s"
        got = collect(sub, b.app_env, 60)
        assert sorted(body["n"] for _, body in got if body.get("run") == run) == list(range(60))
        assert metric(mport, "logjam_bridge_connections_shed_total") >= 21  # the 20 loris and the real client got in
        # Each slowloris is closed at its frame deadline although it keeps sending bytes.
        wait_for(lambda: all(closed_by_peer(s) for s in loris), timeout=20, what="every slowloris to be closed")
        assert metric(mport, "logjam_bridge_protocol_errors_total", reason="frame_timeout") >= 20


# The start of a frame in each protocol, never finished: the bytes trickle in, the frame does not.
NEVER_FINISHED = {
    "lumberjack": b"2J" + struct.pack(">II", 1, 1000) + b"{",
    "courier": b"JDAT" + struct.pack(">I", 1000) + bytes(10),
    "segment": struct.pack(">ii", -1, 1000) + bytes(10),  # AppendBlockEnd, 1,000 bytes announced
    "rustlog": struct.pack(">I", 1000) + b'{"type":',
    "syslog": b"1000 <13>1 2026-11-27T10:00:00Z",  # an octet-counted frame of 1,000 bytes
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", list(NEVER_FINISHED))
def test_every_bridge_closes_a_frame_that_never_finishes(device, tmp_path, protocol: str) -> None:
    mport = free_port()
    data_dir = tmp_path if protocol in ("segment", "rustlog") else None
    b = start_bridge(protocol, device.router, "--metrics-port", str(mport), "--frame-timeout", "2",
                     "--idle-timeout", "60", data_dir=data_dir)
    stop = threading.Event()
    try:
        started = time.monotonic()
        loris = slowloris(b.port, stop, NEVER_FINISHED[protocol], interval=0.25)
        wait_for(lambda: closed_by_peer(loris), timeout=15, what="the slow frame to be cut off")
        took = time.monotonic() - started
        assert 2 <= took < 6, f"closed after {took:.1f}s with --frame-timeout 2"
        wait_for(lambda: metric(mport, "logjam_bridge_protocol_errors_total", protocol, reason="frame_timeout") == 1,
                 what="the frame timeout counted")
        loris.close()
    finally:
        stop.set()
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_per_peer_limit_sheds_idle_then_refuses(device) -> None:
    mport = free_port()
    b = start_lumberjack(device.router, "--metrics-port", str(mport), "--max-connections-per-peer", "3",
                         "--shed-idle-after", "1")
    try:
        # start_lumberjack's port probe was a connection too: let it end first.
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") == 0, what="the probe to close")
        first = open_idle(b.port, 3, ["127.0.0.1"])
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") == 3, what="three open")
        # A peer at its limit whose connections are all busy (inside a frame): refused.
        for s in first:
            s.sendall(b"2J")
        extra = open_idle(b.port, 1, ["127.0.0.1"])[0]
        wait_for(lambda: closed_by_peer(extra), what="the fourth connection to be refused")
        assert metric(mport, "logjam_bridge_connections_refused_per_peer_total") == 1
        # Another address is not limited by this one.
        other = open_idle(b.port, 1, ["127.0.0.2"])[0]
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") == 4, what="another peer admitted")
        for s in [*first, extra, other]:
            s.close()
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") == 0, what="all closed")
        # Idle ones are shed instead of refusing the newcomer.
        idle = open_idle(b.port, 3, ["127.0.0.1"])
        wait_for(lambda: metric(mport, "logjam_bridge_connections_active") == 3, what="three open")
        time.sleep(1.2)  # let them be idle for --shed-idle-after (a duration under test)
        newcomer = open_idle(b.port, 1, ["127.0.0.1"])[0]
        wait_for(lambda: metric(mport, "logjam_bridge_connections_shed_total") == 1, what="one shed")
        assert not closed_by_peer(newcomer)
        # The metric counts the decision; the shed connection's FIN follows it.
        wait_for(lambda: sum(closed_by_peer(s) for s in idle) >= 1, what="the shed connection to close")
        assert sum(closed_by_peer(s) for s in idle) == 1
        for s in [*idle, newcomer]:
            s.close()
    finally:
        stop_bridge(b)


# ---------------------------------------------------------------------------- refused TLS


def tls_attempt(port: int, ctx: ssl.SSLContext | None) -> None:
    """One client that the bridge must refuse; any outcome on our side is fine."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        if ctx is None:
            raw.sendall(b"2W\x00\x00\x00\x01")  # plaintext Lumberjack on the TLS port
            try:
                raw.recv(100)
            except OSError:
                pass
            return
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"2W\x00\x00\x00\x01")
                s.recv(100)  # TLS 1.3: the server's verdict on our certificate arrives here
        except (ssl.SSLError, OSError):
            pass


@pytest.mark.timeout(90)
def test_refused_tls_clients_are_logged_and_counted(device, certs) -> None:
    mport = free_port()
    b = start_lumberjack(device.router, "--metrics-port", str(mport), "--tls-cert", str(certs.server_cert),
                         "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca),
                         "--tls-handshake-timeout", "1")

    def client(cert, key) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.load_cert_chain(str(cert), str(key))
        return ctx

    try:
        tls_attempt(b.port, client(certs.other_client_cert, certs.other_client_key))
        tls_attempt(b.port, client(certs.expired_client_cert, certs.expired_client_key))
        tls_attempt(b.port, None)
        # A client that connects and never starts its handshake holds a slot only until the timeout.
        silent = socket.create_connection(("127.0.0.1", b.port))
        wait_for(lambda: metric(mport, "logjam_bridge_tls_refused_total", reason="client_cert_rejected") == 2
                 and metric(mport, "logjam_bridge_tls_refused_total", reason="not_tls") == 1
                 and metric(mport, "logjam_bridge_tls_refused_total", reason="handshake_timeout") == 1,
                 what="four refusals counted")
        assert closed_by_peer(silent)
        silent.close()
        # Many more plaintext attempts: all counted, but the log is rate-limited.
        for _ in range(30):
            tls_attempt(b.port, None)
        wait_for(lambda: metric(mport, "logjam_bridge_tls_refused_total", reason="not_tls") == 31,
                 what="thirty more refusals counted")
        # A good client is unaffected.
        with socket.create_connection(("127.0.0.1", b.port)) as raw:
            with client(certs.client_cert, certs.client_key).wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"2W\x00\x00\x00\x00")
                assert s.recv(6) == b"2A\x00\x00\x00\x00"
    finally:
        out = stop_bridge(b)
    lines = [line for line in out.splitlines() if "TLS handshake refused" in line]
    assert any("client_cert_rejected" in line and "unable to get local issuer certificate" in line for line in lines), lines
    assert any("client_cert_rejected" in line and "expired" in line for line in lines), lines
    assert any("not_tls" in line for line in lines), lines
    assert any("handshake_timeout" in line for line in lines), lines
    assert all("127.0.0.1:" in line for line in lines)
    assert len(lines) <= 10, f"{len(lines)} lines: the log is not rate-limited"
