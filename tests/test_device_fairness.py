"""Fair admission (devices/fair.py): while importers lag, the loud stream waits and the others go on.

The bookkeeping alone (who is loud, which replies wait), then a real device whose replay
endpoint gets progress reports from a real ReplayClient, as importers send them, and whose
PUB socket a real SUB reads. The whole mesh under a flood: tests/test_mesh_fairness.py.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
import zmq

from devices.batch import TupleBatch
from devices.counters import Counters
from devices.fair import Fairness
from logjam.constants import ACCEPTED, BAD_REQUEST, PONG
from logjam.producer import Producer, ReplyTimeout
from logjam.replay import ReplayClient
from harness.processes import free_port, stop, wait_for


def test_the_streams_above_an_equal_share_are_loud_and_their_replies_keep_each_connection_in_order() -> None:
    counters = Counters()
    fair = Fairness(counters, max_lag=10.0)
    assert fair.threshold == 5.0
    counters.per_app_env.update({b"loud-prod": 9000, b"quiet-prod": 50, b"mid-prod": 2000})
    fair.tick()
    assert fair.heavy == {b"loud-prod"}, "above (9000 + 50 + 2000) / 3"
    assert not fair.pressing(4.0) and fair.pressing(6.0)
    counters.per_app_env[b"quiet-prod"] += 10
    fair.tick()
    assert fair.heavy == {b"loud-prod"}, "the window keeps the last seconds, not only the last one"
    batch, replies = TupleBatch(), []
    add, answer = fair.adder(batch), fair.answerer(replies)
    # Connection A: loud then quiet; B: quiet, a refused message, a ping; A's ping.
    for rid, app in ((b"A", b"loud-prod"), (b"A", b"quiet-prod"), (b"B", b"quiet-prod")):
        add((app, b"t", b"{}", b"m"))
        answer((rid, app, ACCEPTED))
    answer((b"B", b"bad", BAD_REQUEST))
    answer((b"B", b"ping", PONG))
    answer((b"A", b"ping", PONG))
    assert [e[0] for e in batch] == [b"quiet-prod", b"quiet-prod"], "A's quiet message is published at once"
    assert [e[0] for e in fair.parked] == [b"loud-prod"]
    assert replies == [(b"B", b"quiet-prod", ACCEPTED), (b"B", b"bad", BAD_REQUEST), (b"B", b"ping", PONG),
                       (b"A", b"ping", PONG)], "pings are answered at once, even behind a parked reply"
    assert fair.replies == [(b"A", b"loud-prod", ACCEPTED), (b"A", b"quiet-prod", ACCEPTED)], "A's replies in order"
    parked, later = fair.release()
    assert len(parked) == 1 and len(later) == 2 and not fair.parked and not fair.replies
    counters.per_app_env.clear()
    for _ in range(6):
        fair.tick()
    assert fair.heavy == frozenset() and not fair.pressing(60.0), "nothing arrived: nobody is loud"
    assert not Fairness(counters, max_lag=0).pressing(60.0), "--max-importer-lag 0: no flow control at all"


def answered(p: Producer, timeout: float = 0.5) -> bool:
    try:
        p.flush(timeout=timeout)
        return True
    except ReplyTimeout:
        return False


def published(sub: zmq.Socket, seen: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Append every message the SUB has (app-env, body) to `seen`, heartbeats left out."""
    while sub.poll(50):
        app, _topic, body, _meta = sub.recv_multipart()
        if app != b"heartbeat":
            seen.append((app, body))
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("native", ["require", "off"])
def test_a_lagging_importer_parks_the_loud_stream_only(device_factory, tmp_path, native) -> None:
    replay_port, metrics_port = free_port(), free_port()
    dev = device_factory(native=native, extra=[
        "--data-dir", str(tmp_path / "dev"), "--replay-port", str(replay_port), "--metrics-port", str(metrics_port),
        "--max-importer-lag", "8", "--importer-evict-after", "60"])  # loud streams parked past 4 s
    client = ReplayClient(f"tcp://127.0.0.1:{replay_port}", timeout=5)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(dev.pub)
    loud, quiet, mixed = (Producer(dev.router, timeout=5) for _ in range(3))
    seen: list[tuple[bytes, bytes]] = []
    try:
        journal = client.info().journal_id
        for i in range(300):  # the device learns the streams' rates (one tick a second)
            loud.submit("loud-prod", "logs.app", {"n": i})
        assert quiet.request("quiet-prod", "logs.app", {"n": 0})
        assert answered(loud, 5)
        time.sleep(1.5)
        client.progress(journal, client.info().last, "test/worker-0")  # in sync, then stays there
        wait_for(lambda: "test/worker-0" in urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode(), timeout=10, what="the report")
        assert loud.request("loud-prod", "logs.app", {"n": 300}), "0 s behind: answered at once"
        ends = time.monotonic() + 4.5  # ... and never committed: 4.5 s behind, past 4 s
        while time.monotonic() < ends:  # the loud stream goes on, answered until the importer is 4 s behind
            loud.submit("loud-prod", "logs.app", {"n": 200_000})
            quiet.submit("quiet-prod", "logs.app", {"n": 200_000})  # a stream is loud only beside another
            client.progress(journal, 0, "test/worker-0")  # still reporting (not stale), still behind
            time.sleep(0.1)
        for i in range(301, 351):
            loud.submit("loud-prod", "logs.app", {"n": i})
        mixed.submit("loud-prod", "logs.app", {"n": 1000})
        mixed.submit("quiet-prod", "logs.app", {"n": 1001})
        assert answered(quiet, 2) and quiet.request("quiet-prod", "logs.app", {"n": 1}), \
            "the quiet stream is answered while the loud waits"
        assert not answered(loud, 0.2), "the loud stream is parked"
        assert not answered(mixed, 0.0), "a reply behind a parked one waits, in order"
        assert loud.ping(timeout=1), "pings are answered at once: the device is not hung"
        # Parked for MAX_PARK seconds at most: committed and answered though the importer is still behind.
        assert answered(loud, 10) and answered(mixed, 10)
        wait_for(lambda: {b'{"n":350}', b'{"n":1000}'} <= {body for _, body in published(sub, seen)}, timeout=10,
                 what="every parked message to be published")
        assert seen.index((b"quiet-prod", b'{"n":1001}')) < seen.index((b"loud-prod", b'{"n":1000}')), \
            "the mixed connection's quiet event went first"
        assert seen.index((b"quiet-prod", b'{"n":1}')) < seen.index((b"loud-prod", b'{"n":301}')), "the quiet stream went first"
        loud_order = [body for app, body in seen if app == b"loud-prod" and body not in (b'{"n":1000}', b'{"n":200000}')]
        assert loud_order[-50:] == [b'{"n":%d}' % i for i in range(301, 351)], "parked in arrival order"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
        parked = [line for line in metrics.splitlines() if line.startswith("logjam_device_fair_parked_messages_total")]
        assert parked and float(parked[0].split()[-1]) >= 51
        longest = [line for line in metrics.splitlines() if line.startswith("logjam_device_fair_longest_park_seconds")]
        assert 1.0 <= float(longest[0].split()[-1]) <= 5.0, longest
    finally:
        for p in (loud, quiet, mixed):
            p.close(ping=False)
        sub.close()
        client.close()
    assert stop(dev.proc) == 0
