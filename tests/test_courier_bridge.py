"""`logjam-bridge courier` over real sockets, with a real `logjam-device`, a subscriber and the
spec-following client in harness/courier_client.py: N events in, N Logjam messages out; the
handshake and the legacy path; pipelining and ACKN order; a paused device (partial ACKNs,
flat memory, everything once after resume); bad input next to a good client; TLS and mTLS.

Every test whose events or acknowledgements go through the bridge's device link and the device's
loop runs twice, under LOGJAM_NATIVE=require (the C link and loop) and off (their Python twins):
`native_device` is on each. The courier engine itself is Python on both paths, so the tests that only
assert what it does with a connection that carries no event (handshake, a refused header, PING
with a body, the idle timeout) run once, with `one_bridge` under the LOGJAM_NATIVE they inherit."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import threading
import time
import uuid
from typing import Any

import orjson
import pytest

from bridges.courier.engine import CourierClient
from bridges.courier.messages import VersionReceived
from logjam.message import Message
from tests.bridge_support import BridgeProcess, client_tls, collect, no_more, ready_subscriber, start_bridge, stop_bridge
from harness.courier_client import TestCourierClient
from harness.processes import wait_for

# Native-sensitive (LOGJAM_NATIVE picks the C path or its Python twin): `native_device` runs on both.
pytestmark = pytest.mark.native


def start_courier(device_router: str, *extra: str, **kwargs: Any) -> BridgeProcess:
    """`logjam-bridge courier` acknowledging every second, so partial ACKNs come soon."""
    return start_bridge("courier", device_router, "--keepalive-interval", "1", *extra, **kwargs)


def events(n: int, run: str, start: int = 0, pad: int = 0) -> list[bytes]:
    """`pad` adds that many random hex characters, which zlib cannot shrink much."""
    return [
        orjson.dumps({
            "message": f"event {i} " + os.urandom(pad // 2).hex(), "run": run, "n": i, "host": "web-1", "path": "/var/log/app.log",
            "offset": i * 100, "@timestamp": f"2024-05-01T12:00:{i % 60:02d}.250Z",
        })
        for i in range(start, start + n)
    ]


def check_once(got: list[tuple[Message, dict[str, Any]]], expected_n: range) -> None:
    assert sorted(body["n"] for _, body in got) == list(expected_n)


@pytest.fixture
def bridge(native_device):
    b = start_courier(native_device.router)
    yield b
    stop_bridge(b)


@pytest.fixture
def one_bridge(device):
    b = start_courier(device.router)
    yield b
    stop_bridge(b)


# ------------------------------------------------------------------ delivery

@pytest.mark.timeout(60)
def test_one_event_body_metadata_app_env(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as client:
        payload = client.send(events(1, run))
        client.wait_all_acked()
        local = "%s:%d" % client.sock.getsockname()[:2]
    assert payload.acks[-1][1] == 1
    [(msg, body)] = collect(sub, bridge.app_env, 1)
    assert no_more(sub, bridge.app_env, 0.5) == []
    assert msg.app_env == bridge.app_env and msg.topic == "logs.courier"
    assert msg.meta.created_ms == 1714564800250  # from @timestamp
    assert {k: v for k, v in body.items() if k != "@metadata"} == orjson.loads(events(1, run)[0])
    meta = body["@metadata"]
    assert meta["protocol"] == "courier" and meta["protocol_version"] == "2"
    assert meta["nonce"] == payload.nonce.hex() and meta["index"] == 0
    assert meta["peer"] == local
    assert abs(meta["received_at"] - time.time() * 1000) < 60_000
    assert "tls" not in meta


@pytest.mark.timeout(120)
def test_1024_event_payloads_jdat_and_evnt(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as client:
        sent = []
        for k in range(4):
            sent.append(client.send(events(1024, run, start=k * 1024), kind="EVNT" if k % 2 else "JDAT"))
            client.wait_all_acked()
    got = collect(sub, bridge.app_env, 4096)
    assert no_more(sub, bridge.app_env, 0.5) == []
    check_once(got, range(4096))
    by_n = {body["n"]: body["@metadata"] for _, body in got}
    for k, p in enumerate(sent):
        assert p.acks[-1][1] == 1024
        for i in (0, 511, 1023):
            assert by_n[k * 1024 + i]["nonce"] == p.nonce.hex() and by_n[k * 1024 + i]["index"] == i


@pytest.mark.timeout(120)
def test_ten_payloads_pipelined_acked_in_order(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as client:
        sent = [client.send(events(1024, run, start=k * 1024), kind="EVNT" if k % 3 == 0 else "JDAT") for k in range(10)]
        # The client checks every ACKN as it arrives: known nonce, oldest payload first,
        # sequence never down and never beyond the count.
        client.wait_all_acked(60)
        assert [p.nonce for p in client.done] == [p.nonce for p in sent]
        finals = [(t, n) for t, n, seq in client.acks if seq == 1024]
        assert [n for _, n in finals] == [p.nonce for p in sent]
    got = collect(sub, bridge.app_env, 10 * 1024)
    assert no_more(sub, bridge.app_env, 0.5) == []
    check_once(got, range(10 * 1024))


@pytest.mark.timeout(120)
def test_large_evnt_payload_streams_through(native_device, bridge) -> None:
    # 16384 events in one EVNT stream: decoded and forwarded while it still arrives,
    # acknowledged once, completely, and every event published once.
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    n = 16384
    with TestCourierClient(bridge.port) as client:
        payload = client.send(events(n, run, pad=64), kind="EVNT")
        client.wait_all_acked(90)
        seqs = [seq for _, seq in payload.acks]
        assert seqs[-1] == n and seqs == sorted(seqs)
    got = collect(sub, bridge.app_env, n, timeout=90)
    assert no_more(sub, bridge.app_env, 0.5) == []
    check_once(got, range(n))
    assert sorted(body["@metadata"]["index"] for _, body in got) == list(range(n))


@pytest.mark.timeout(60)
def test_legacy_client_without_handshake(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port, handshake=False) as client:
        client.send(events(5, run))
        client.wait_all_acked()
        client.ping()
        assert client.version is None, "an old client that starts with JDAT must get no VERS"
    got = collect(sub, bridge.app_env, 5)
    check_once(got, range(5))
    assert got[0][1]["@metadata"]["protocol_version"] == "1"


@pytest.mark.timeout(60)
def test_handshake_with_ruby_sized_helo(one_bridge) -> None:
    # The Ruby client sends a 20-byte HELO body; the answer is a VERS announcing EVNT.
    with socket.create_connection(("127.0.0.1", one_bridge.port), timeout=10) as sock:
        body = struct.pack(">4sIII4s", b"\0\0\0\0", 2, 0, 0, b"RYLC")
        sock.sendall(b"HELO" + struct.pack(">I", len(body)) + body)
        engine, got = CourierClient(), []
        while not got:
            data = sock.recv(4096)
            assert data, "closed before VERS"
            got += engine.feed(data)
        assert isinstance(got[0], VersionReceived) and got[0].handshake.supports_evnt


# ------------------------------------------------------------------ the device paused

def _acks_of(client: TestCourierClient, nonce: bytes) -> list[tuple[float, int]]:
    with client.cond:
        return [(t, seq) for t, n, seq in client.acks if n == nonce]


@pytest.mark.timeout(120)
def test_device_paused_partial_acks_flat_memory_then_everything_once(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    per, payloads = 1024, 40
    with TestCourierClient(bridge.port) as client:
        client.send(events(per, run))  # warm up: everything works before the pause
        client.wait_all_acked()
        collect(sub, bridge.app_env, per)
        os.kill(native_device.proc.pid, signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            first = client.send(events(per, run, start=per, pad=200))
            # Partial (keepalive) ACKNs arrive within 5 s and keep arriving; no final ack.
            wait_for(lambda: len(_acks_of(client, first.nonce)) >= 1, timeout=5, what="a partial ACKN within 5 s")
            rss_start = bridge.rss_kib()
            # Meanwhile the client keeps sending; the bridge must stop reading, not buffer.
            sender = threading.Thread(
                target=lambda: [client.send(events(per, run, start=(k + 2) * per, pad=200)) for k in range(payloads - 2)],
                daemon=True,
            )
            sender.start()
            wait_for(lambda: time.monotonic() - paused_at > 4, timeout=10, interval=0.2, what="4 s of pause")
            rss_mid = bridge.rss_kib()
            wait_for(lambda: time.monotonic() - paused_at > 7, timeout=10, interval=0.2, what="7 s of pause")
            acks = _acks_of(client, first.nonce)
            assert all(seq < per for _, seq in acks), "a final ACKN while the device is stopped"
            times = [paused_at] + [t for t, _ in acks]
            assert max(b - a for a, b in zip(times, times[1:])) <= 5.0, f"ACKN gaps: {times}"
            assert len(acks) >= 2
            rss_end = bridge.rss_kib()
            # Reading everything the client sent would take ~60 MB; a bounded bridge levels off.
            assert rss_end - rss_start < 30_000, f"bridge RSS grew {rss_start} -> {rss_end} KiB while the device was paused"
            assert rss_end - rss_mid < 8_000, f"bridge RSS still growing: {rss_mid} -> {rss_end} KiB"
            assert len(client.done) == 1
        finally:
            os.kill(native_device.proc.pid, signal.SIGCONT)
        sender.join(60)
        assert not sender.is_alive()
        client.wait_all_acked(90)
        assert len(client.done) == payloads
    got = collect(sub, bridge.app_env, (payloads - 1) * per, timeout=90)
    assert no_more(sub, bridge.app_env, 1.0) == []
    check_once(got, range(per, payloads * per))


# ------------------------------------------------------------------ bad input

def _closed_without_ack(client: TestCourierClient) -> None:
    client.wait_closed(10)
    assert client.pending and not client.done


@pytest.mark.timeout(60)
def test_corrupt_zlib_closes_only_that_connection(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as good, TestCourierClient(bridge.port) as bad:
        good.send(events(100, run))
        body = os.urandom(16) + b"\x78\x9c" + b"definitely not deflate data" * 10
        bad.send_encoded(body[:16], 3, b"JDAT" + struct.pack(">I", len(body)) + body)
        _closed_without_ack(bad)
        good.send(events(100, run, start=100))
        good.wait_all_acked()
    check_once(collect(sub, bridge.app_env, 200), range(200))


@pytest.mark.timeout(60)
def test_oversize_length_is_refused_on_the_header(one_bridge) -> None:
    with TestCourierClient(one_bridge.port) as client:
        # Only the header: the bridge must not wait for (or allocate) 10 MiB + 1.
        client.send_encoded(os.urandom(16), 1, b"JDAT" + struct.pack(">I", 10 * 1024 * 1024 + 1))
        _closed_without_ack(client)
    # Stopped here to read its log; the fixture's second stop finds it exited 0.
    assert "frame_too_large" in stop_bridge(one_bridge)


@pytest.mark.timeout(60)
def test_unknown_type_gets_question_marks_and_keeps_the_connection(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as client:
        client.send_raw(b"NEWT\0\0\0\x05hello")
        client.wait(lambda: client.unknowns == 1, 10, "????")
        client.send(events(3, run))
        client.wait_all_acked()
        client.ping()
    check_once(collect(sub, bridge.app_env, 3), range(3))


@pytest.mark.timeout(60)
def test_ping_with_body_closes(one_bridge) -> None:
    with TestCourierClient(one_bridge.port) as client:
        client.send_raw(b"PING\0\0\0\x01x")
        client.wait_closed(10)
        assert client.pongs == 0


@pytest.mark.timeout(60)
def test_garbage_connection_next_to_a_good_one(native_device, bridge) -> None:
    sub = ready_subscriber(native_device.pub, native_device.router, bridge.app_env)
    run = uuid.uuid4().hex
    with TestCourierClient(bridge.port) as good:
        good.send(events(500, run))
        with socket.create_connection(("127.0.0.1", bridge.port), timeout=10) as junk:
            junk.sendall(os.urandom(4096))
            good.send(events(500, run, start=500), kind="EVNT")
            junk.settimeout(10)
            try:
                while junk.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        good.wait_all_acked()
    check_once(collect(sub, bridge.app_env, 1000), range(1000))


@pytest.mark.timeout(60)
def test_idle_timeout_closes_a_silent_connection(device) -> None:
    b = start_courier(device.router, "--idle-timeout", "1")
    try:
        with TestCourierClient(b.port) as client:
            t0 = time.monotonic()
            client.wait_closed(10)
            assert time.monotonic() - t0 < 8
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_sigterm_after_acks_exits_zero(native_device, bridge) -> None:
    with TestCourierClient(bridge.port) as client:
        client.send(events(10, "x"))
        client.wait_all_acked()
        out = stop_bridge(bridge)
        client.wait_closed(10)
    assert "stopped" in out


# ------------------------------------------------------------------ TLS

@pytest.mark.timeout(60)
def test_tls(native_device, certs) -> None:
    b = start_courier(native_device.router, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        with TestCourierClient(b.port, tls=client_tls(certs)) as client:
            client.send(events(50, "tls"), kind="EVNT")
            client.wait_all_acked()
        got = collect(sub, b.app_env, 50)
        check_once(got, range(50))
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["version"] in ("TLSv1.2", "TLSv1.3") and tls["cipher"]
        assert tls["cn"] is None
        # A plain-TCP client against the TLS port gets nowhere.
        with pytest.raises((AssertionError, OSError)):
            with TestCourierClient(b.port, timeout=5) as plain:
                plain.send(events(1, "plain"))
                plain.wait_all_acked(5)
    finally:
        stop_bridge(b)


def _refused(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        with TestCourierClient(port, tls=ctx, timeout=10) as client:
            client.send(events(1, "refused"))
            client.wait_all_acked(10)
    except (AssertionError, OSError):
        return True
    return False


@pytest.mark.timeout(90)
def test_mutual_tls(native_device, certs) -> None:
    b = start_courier(
        native_device.router, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
    )
    try:
        sub = ready_subscriber(native_device.pub, native_device.router, b.app_env)
        with TestCourierClient(b.port, tls=client_tls(certs, cert=True)) as client:
            client.send(events(20, "mtls"))
            client.wait_all_acked()
        got = collect(sub, b.app_env, 20)
        check_once(got, range(20))
        tls = got[0][1]["@metadata"]["tls"]
        assert tls["cn"] == "test-client" and "test-client" in tls["subject"]
        assert _refused(b.port, client_tls(certs))  # no certificate
        assert _refused(b.port, client_tls(certs, other=True))  # signed by a CA we do not trust
        assert no_more(sub, b.app_env, 0.5) == []
    finally:
        stop_bridge(b)
