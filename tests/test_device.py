"""The real logjam-device process over real sockets: routing, replies, renumbering, pings, drops."""

from __future__ import annotations

import json
import re

import socket
import time

import pytest
import zmq

from logjam.compression import compress, decompress
from logjam.meta import Compression, now_ms
from logjam.producer import Producer
from tests.conftest import NATIVE_MODES
from harness.processes import command, free_port, start, stop, wait_for
from tests.test_device_helpers import Tap, dealer, meta, push, reply, unpack

# Native-sensitive (LOGJAM_NATIVE picks the C loop or its Python twin): every test whose outcome the loop
# decides runs on both (engine_device, native_mode); flags refused before a loop runs are tested once.
pytestmark = [pytest.mark.timeout(60), pytest.mark.native]


@pytest.fixture
def tap(device):
    t = Tap(device.pub, device.pull)
    yield t
    t.close()


@pytest.fixture(params=NATIVE_MODES)
def engine_device(request, device_factory):
    """A device on each loop: LOGJAM_NATIVE=require (the C fast path) and off (the pure-Python loop)."""
    return device_factory(native=request.param)
# (The plain `device` fixture inherits LOGJAM_NATIVE: only test_port_in_use_is_a_clear_error, whose
# second device fails at bind before any loop runs, takes it.)


@pytest.fixture
def engine_tap(engine_device):
    t = Tap(engine_device.pub, engine_device.pull)
    yield t
    t.close()


def test_dealer_request_is_accepted_and_published_with_device_numbering(engine_device, engine_tap):
    assert engine_device.device_id == 1
    with Producer(engine_device.router) as p:
        assert p.request("shop-production", "logs.rails.request", {"n": 1}, created_ms=1_700_000_000_555)
    frames = engine_tap.expect()
    assert frames[:3] == [b"shop-production", b"logs.rails.request", b'{"n":1}']
    m = unpack(frames[3])
    assert m.device == 1
    assert m.created_ms == 1_700_000_000_555
    assert m.compression == Compression.NONE
    assert m.seq >= 1


def test_push_and_dealer_share_one_sequence(engine_device, engine_tap):
    d = dealer(engine_device.router)
    s = push(engine_device.pull)
    s.send_multipart([b"a-b", b"logs", b"1", meta(seq=99)])
    first = engine_tap.expect()
    d.send_multipart([b"a-b", b"logs", b"2", meta(seq=5)])  # async DEALER, no reply expected
    second = engine_tap.expect()
    s.send_multipart([b"a-b", b"logs", b"3", meta(seq=7)])
    third = engine_tap.expect()
    seqs = [unpack(f[3]).seq for f in (first, second, third)]
    assert [f[2] for f in (first, second, third)] == [b"1", b"2", b"3"]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]
    assert not d.poll(200), "an async DEALER message must not be answered"
    d.close()
    s.close()


def test_zero_created_ms_becomes_now(engine_device, engine_tap):
    s = push(engine_device.pull)
    before = now_ms()
    s.send_multipart([b"a-b", b"logs", b"{}", meta(created_ms=0)])
    m = unpack(engine_tap.expect()[3])
    assert before <= m.created_ms <= now_ms()
    s.close()


def test_legacy_three_frame_push_gets_a_fresh_meta(engine_device, engine_tap):
    s = push(engine_device.pull)
    before = now_ms()
    s.send_multipart([b"old-client", b"logs.legacy", b'{"x":1}'])
    frames = engine_tap.expect()
    assert frames[:3] == [b"old-client", b"logs.legacy", b'{"x":1}']
    m = unpack(frames[3])
    assert (m.device, m.compression, m.version) == (1, 0, 1)
    assert before <= m.created_ms <= now_ms()
    s.close()


def test_byte_swapped_tag_on_pull_is_normalised(engine_device, engine_tap):
    s = push(engine_device.pull)
    s.send_multipart([b"a-b", b"logs", b"{}", meta(tag=0xBDCA, compression=3, created_ms=77)])
    out = engine_tap.expect()[3]
    assert out[:4] == b"\xca\xbd\x03\x01"
    assert unpack(out).created_ms == 77
    s.close()


def test_byte_swapped_tag_is_accepted_and_normalised(engine_device, engine_tap):
    d = dealer(engine_device.router)
    d.send_multipart([b"", b"a-b", b"logs", b"{}", meta(tag=0xBDCA, compression=2)])
    assert reply(d) == [b"a-b", b"202 Accepted"]
    out = engine_tap.expect()[3]
    assert out[:4] == b"\xca\xbd\x02\x01"
    d.close()


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"a-b", b"bogus.topic", b"{}", meta()], id="bad-topic"),
        pytest.param([b"nodash", b"logs", b"{}", meta()], id="app-env-without-dash"),
        pytest.param([b"a-\x01b", b"logs", b"{}", meta()], id="app-env-control-byte"),
        pytest.param([b"a-b", b"logs", b"{}", meta()[:23]], id="short-meta"),
        pytest.param([b"a-b", b"logs", b"{}", meta(version=2)], id="meta-version"),
        pytest.param([b"a-b", b"logs", b"{}", meta(tag=0x1234)], id="meta-tag"),
        pytest.param([b"a-b", b"logs", b"{}", meta(compression=7)], id="meta-compression"),
        pytest.param([b"a-b", b"logs", b"{}"], id="three-frames-on-router"),
        pytest.param([b"a-b", b"logs", b"{}", meta(), b"extra"], id="five-frames"),
        pytest.param([b"a-b", b"logs", b"{}", meta()] + [b"x"] * 8, id="twelve-frames"),
    ],
)
def test_bad_requests_get_400_and_are_not_published(engine_device, engine_tap, frames):
    d = dealer(engine_device.router)
    d.send_multipart([b""] + frames)
    assert reply(d) == [frames[0], b"400 Bad Request"]
    assert engine_tap.quiet(0.3)
    # One bad request does not disturb the next good one on the same connection.
    d.send_multipart([b"", b"a-b", b"logs", b"ok", meta()])
    assert reply(d) == [b"a-b", b"202 Accepted"]
    assert engine_tap.expect()[2] == b"ok"
    d.close()


def test_empty_request_gets_400(engine_device):
    d = dealer(engine_device.router)
    d.send_multipart([b""])
    assert reply(d) == [b"", b"400 Bad Request"]
    d.close()


def test_ping_is_answered_with_fqdn_and_never_published(engine_device, engine_tap):
    d = dealer(engine_device.router)
    d.send_multipart([b"", b"ping", b"a-b", b"{}", meta()])
    assert reply(d) == [b"ping", b"200 OK", socket.getfqdn().encode()]
    assert engine_tap.quiet(0.3)
    d.send_multipart([b"", b"ping", b"a-b", b"{}", meta()[:10]])
    assert reply(d) == [b"ping", b"400 Bad Request"]
    d.close()


def test_ping_edge_cases(engine_device, engine_tap):
    d = dealer(engine_device.router)
    d.send_multipart([b"", b"ping"])
    assert reply(d) == [b"ping", b"400 Bad Request"]
    d.send_multipart([b"", b"ping", b"a-b", b"{}", meta(), b"extra"])
    assert reply(d) == [b"ping", b"400 Bad Request"]
    # Not a request (no empty frame): a data message from a stream called "ping", dropped, unanswered.
    d.send_multipart([b"ping", b"a-b", b"{}", meta()])
    assert engine_tap.quiet(0.3)
    assert not d.poll(100)
    d.close()


def test_a_client_that_never_reads_replies_does_not_block_others(engine_device, engine_tap):
    lazy = zmq.Context.instance().socket(zmq.DEALER)
    lazy.linger = 0
    lazy.rcvhwm = 1
    lazy.connect(engine_device.router)
    for i in range(3000):
        lazy.send_multipart([b"", b"lazy-client", b"logs", b"%d" % i, meta()])
    with Producer(engine_device.router, timeout=5) as p:
        assert p.request("busy-client", "logs", b"{}")
    got = 0
    while got < 3001:
        assert engine_tap.expect() is not None
        got += 1
    lazy.close()


def test_producer_ping_and_close(engine_device, engine_tap):
    with Producer(engine_device.router, timeout=5) as p:
        assert p.ping() == socket.getfqdn()
        for i in range(50):
            p.submit("shop-production", "logs", {"i": i})
        assert p.flush().accepted == 50
    got = [engine_tap.expect() for _ in range(50)]
    assert [f[2] for f in got] == [b'{"i":%d}' % i for i in range(50)]


def test_push_producer(engine_device, engine_tap):
    with Producer(engine_device.pull, mode="push") as p:
        for i in range(100):
            p.send("shop-production", "events.signup", {"i": i})
    got = [engine_tap.expect() for _ in range(100)]
    seqs = [unpack(f[3]).seq for f in got]
    assert seqs == list(range(seqs[0], seqs[0] + 100))


def test_many_clients_at_once(engine_device, engine_tap):
    producers = [Producer(engine_device.router) for _ in range(5)] + [Producer(engine_device.pull, mode="push") for _ in range(5)]
    for k, p in enumerate(producers):
        for i in range(20):
            if p.mode == "dealer":
                p.submit(f"app{k}-prod", "logs", {"i": i})
            else:
                p.send(f"app{k}-prod", "logs", {"i": i})
    for p in producers:
        if p.mode == "dealer":
            assert p.flush().accepted == 20
        p.close()
    got = [engine_tap.expect() for _ in range(200)]
    seqs = sorted(unpack(f[3]).seq for f in got)
    assert seqs == list(range(seqs[0], seqs[0] + 200))
    assert engine_tap.quiet(0.2)


def test_heartbeats_share_the_sequence(device_factory, native_mode):
    dev = device_factory(device_id=4, extra=["--heartbeat-interval", "0.2"], native=native_mode)
    tap = Tap(dev.pub, dev.pull, keep_heartbeats=True)
    s = push(dev.pull)
    beats = []
    deadline = time.monotonic() + 10
    while len(beats) < 2:
        s.send_multipart([b"a-b", b"logs", b"data", meta()])
        frames = tap.expect()
        if frames[0] == b"heartbeat":
            beats.append(frames)
        assert time.monotonic() < deadline
    hb = beats[0]
    assert hb[:2] == [b"heartbeat", f"tcp://{socket.getfqdn()}:{dev.pub_port}".encode()]
    m = unpack(hb[3])
    # The body names the journal; without one, nothing older than the heartbeat itself is held.
    body = json.loads(hb[2])
    assert set(body) == {"journal", "first"} and re.fullmatch("[0-9a-f]{16}", body["journal"])
    assert body["first"] == m.seq
    assert (m.device, m.compression) == (4, 0)
    assert abs(m.created_ms - now_ms()) < 10_000
    # A data message after the heartbeat carries the next number.
    s.send_multipart([b"a-b", b"logs", b"after", meta()])
    while (frames := tap.expect())[0] == b"heartbeat":
        pass
    assert unpack(frames[3]).seq > unpack(beats[-1][3]).seq
    tap.close()
    s.close()


def test_stats_once_a_second(device_factory, native_mode):
    dev = device_factory(device_id=9, native=native_mode)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.subscribe(b"stats")
    sub.connect(dev.stats)
    with Producer(dev.router) as p:
        for _ in range(3):
            assert p.request("a-b", "logs", b"{}")
    # Count what arrives in a 3.5 s window (poll with a deadline; robust to a loaded machine).
    assert sub.poll(3000), "no stats within 3 s"
    seen = [sub.recv_multipart()]
    window_end = time.monotonic() + 3.5
    while (left := window_end - time.monotonic()) > 0:
        if sub.poll(int(left * 1000) + 1):
            seen.append(sub.recv_multipart())
    for frames in seen:
        assert len(frames) == 4 and frames[:2] == [b"stats", b"9"]
        assert int(frames[2]) >= 3
        health = json.loads(frames[3])
        assert re.fullmatch("[0-9a-f]{16}", health["journal"])
        assert health["journal_writable"] is True and health["journal_write_failures"] == 0 and health["held_messages"] == 0
    assert 2 <= len(seen) <= 6, f"{len(seen)} stats messages in 3.5 s"
    sub.close()


@pytest.mark.parametrize("method", ["zlib", "snappy", "lz4"])
def test_compress_flag_compresses_only_uncompressed_bodies(device_factory, method, native_mode):
    dev = device_factory(extra=["--compress", method], native=native_mode)
    tap = Tap(dev.pub, dev.pull)
    cid = Compression.parse(method)
    body = b'{"message":"' + b"hello " * 50 + b'"}'
    s = push(dev.pull)
    s.send_multipart([b"a-b", b"logs", body, meta(compression=0)])
    out = tap.expect()
    assert unpack(out[3]).compression == cid
    assert out[2] != body and decompress(cid, out[2]) == body
    # Already compressed (with another method): passed through untouched.
    other = Compression.ZLIB if cid != Compression.ZLIB else Compression.SNAPPY
    packed = compress(other, body)
    s.send_multipart([b"a-b", b"logs", packed, meta(compression=other)])
    out = tap.expect()
    assert unpack(out[3]).compression == other and out[2] == packed
    # Legacy 3-frame bodies are uncompressed by definition.
    s.send_multipart([b"a-b", b"logs", body])
    out = tap.expect()
    assert unpack(out[3]).compression == cid and decompress(cid, out[2]) == body
    tap.close()
    s.close()


@pytest.mark.parametrize("engine", NATIVE_MODES)
def test_sigterm_exits_zero_after_publishing_what_it_received(device_factory, engine):
    dev = device_factory(native=engine)
    tap = Tap(dev.pub, dev.pull)
    with Producer(dev.router) as p:
        for i in range(200):
            p.submit("a-b", "logs", {"i": i})
        assert p.flush().accepted == 200
    with Producer(dev.pull, mode="push") as p:
        for i in range(200):
            p.send("a-b", "logs", {"p": i})
    assert stop(dev.proc) == 0
    got = []
    while (frames := tap.recv(2.0)) is not None:
        got.append(frames)
    out = dev.output()
    counts = re.search(r"stopped: seq \d+, published \d+, received \{'router': (\d+), 'pull': (\d+)\}", out)
    assert counts, out
    router, pull = map(int, counts.groups())
    bodies = [f[2] for f in got if f[0] == b"a-b"]
    # Every request was acknowledged (published before its 202), so all 200 arrive. PUSH has
    # no acknowledgement: what was still on its way when SIGTERM came is not the device's to
    # flush, but what it had taken in goes out, and nothing twice. (The tap's join probes
    # also came in over PULL, so `pull` counts them too.)
    assert router == 200 and pull > 0
    assert sorted(b for b in bodies if b.startswith(b'{"i"')) == sorted(b'{"i":%d}' % i for i in range(200))
    pushed = [b for b in bodies if b.startswith(b'{"p"')]
    assert len(pushed) == len(set(pushed)) and len(pushed) <= min(200, pull)
    assert ("(native engine)" if engine == "require" else "(python engine)") in out
    assert "stopped" in out and "Traceback" not in out
    tap.close()


def test_config_file_and_flags(tmp_path, native_mode):
    ports = {name: free_port() for name in ("router", "pull", "pub", "stats")}
    cfg = tmp_path / "device.toml"
    cfg.write_text(
        f'bind = "127.0.0.1"\nrouter-port = {ports["router"]}\npull_port = {ports["pull"]}\n'
        f'pub-port = {ports["pub"]}\nstats-port = {ports["stats"]}\ndevice-id = 42\ncompress = "lz4"\n'
        'allow-plaintext = "all"\n'
    )
    proc = start([command("logjam-device"), "--config", str(cfg)], env={"LOGJAM_NATIVE": native_mode})
    try:
        tap = Tap(f"tcp://127.0.0.1:{ports['pub']}", f"tcp://127.0.0.1:{ports['pull']}")
        s = push(f"tcp://127.0.0.1:{ports['pull']}")
        s.send_multipart([b"a-b", b"logs", b"{}", meta()])
        m = unpack(tap.expect()[3])
        assert (m.device, m.compression) == (42, Compression.LZ4)
        s.close()
        tap.close()
    finally:
        assert stop(proc) == 0


def test_bad_flags_and_help():
    import subprocess

    ok = subprocess.run([command("logjam-device"), "--help"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "--router-port" in ok.stdout and "--heartbeat-interval" in ok.stdout
    bad = subprocess.run([command("logjam-device"), "--compress", "brotli"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "brotli" in bad.stderr
    bad = subprocess.run([command("logjam-device"), "-d", str(2**32)], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2


def test_port_in_use_is_a_clear_error(device):
    import subprocess

    r = subprocess.run(
        [command("logjam-device"), "--bind", "127.0.0.1", "-t", str(device.router_port), "-p", str(free_port()),
         "-P", str(free_port()), "-s", str(free_port()), "--allow-plaintext"],
        capture_output=True, text=True, timeout=30,
    )
    assert r.returncode == 1 and "cannot start" in r.stderr
