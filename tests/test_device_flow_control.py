"""Flow control from importers to the device: no input while an in-sync importer is too far behind.

The bookkeeping (devices/lag.py) alone with a hand-driven clock, then a real device whose
replay endpoint gets progress reports from a real ReplayClient, as importers send them.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from devices.lag import ImporterLag
from logjam.producer import Producer, ReplyTimeout
from logjam.replay import ReplayClient
from harness.processes import free_port, stop, wait_for

J = "0123456789abcdef"


def test_an_importer_holds_input_only_while_in_sync_and_behind() -> None:
    lag = ImporterLag(J, max_lag=2.0, evict_after=10.0)
    lag.published(100, now=0.0)
    assert lag.admit(0.0), "nobody reports: nothing to wait for"
    lag.progress("a", J, 40, now=0.0)  # far behind from the start (catching up): not in sync
    assert lag.admit(5.0)
    lag.progress("a", J, 100, now=5.0)
    assert lag.admit(5.0)  # caught up: now in sync
    lag.published(150, now=6.0)
    assert lag.admit(7.5) and lag.lag_of(100, 7.5) == pytest.approx(1.5)
    assert not lag.admit(8.5), "2.5 s behind an in-sync importer: hold"
    assert lag.holding
    lag.progress("a", J, 150, now=8.6)
    assert lag.admit(8.6) and lag.held_total(8.6) == pytest.approx(0.1)
    lag.progress("b", "fedcba9876543210", 0, now=9.0)  # another journal's importer: not ours
    assert lag.lags(9.0) == {"a": 0.0}


def test_an_importer_too_many_messages_behind_holds_input_within_the_seconds_limit() -> None:
    # 10 s at 100k+ messages/s outgrows the PUB high-water mark: the message bound holds first.
    lag = ImporterLag("j", max_lag=10.0, evict_after=60.0, max_messages=1000)
    lag.published(10, 0.0)
    lag.progress("imp", "j", 10, 0.0)
    assert lag.admit(0.1)  # joins the in-sync set
    lag.published(900, 0.2)
    lag.progress("imp", "j", 10, 0.2)
    assert lag.admit(0.3)  # 890 behind, under 1000
    lag.published(1500, 0.4)
    lag.progress("imp", "j", 400, 0.4)
    assert not lag.admit(0.5)  # 1100 behind after half a second
    lag.progress("imp", "j", 1400, 0.6)
    assert lag.admit(0.7)


def test_a_stuck_importer_is_evicted_and_a_silent_one_forgotten() -> None:
    lag = ImporterLag(J, max_lag=2.0, evict_after=10.0)
    lag.published(10, now=0.0)
    lag.progress("a", J, 10, now=0.0)
    assert lag.admit(0.0)
    lag.published(20, now=1.0)
    lag.progress("a", J, 10, now=4.0)  # still reporting, still at 10
    assert not lag.admit(4.0)
    lag.progress("a", J, 10, now=13.0)
    assert not lag.admit(13.0)
    lag.progress("a", J, 10, now=14.5)
    assert lag.admit(14.5), "over the limit for more than evict_after: no longer waited for"
    lag.progress("a", J, 20, now=15.0)
    assert lag.admit(15.0) and lag.admit(21.0)
    assert lag.lags(21.0) == {}, "no report for 5 s: gone"


def answered(p: Producer) -> bool:
    """Whether every request sent so far has its reply (waiting half a second for it)."""
    try:
        p.flush(timeout=0.5)
        return True
    except ReplyTimeout:
        return False


@pytest.mark.timeout(120)
def test_a_real_device_stops_answering_while_an_importer_lags(device_factory, tmp_path) -> None:
    replay_port, metrics_port = free_port(), free_port()
    dev = device_factory(extra=["--data-dir", str(tmp_path / "dev"), "--replay-port", str(replay_port),
                                "--metrics-port", str(metrics_port),
                                "--max-importer-lag", "1", "--importer-evict-after", "6"])

    def metric_text(_dev: object) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
    client = ReplayClient(f"tcp://127.0.0.1:{replay_port}", timeout=5)
    name = "test/worker-0"
    try:
        journal = client.info().journal_id
        with Producer(dev.router, timeout=0.5) as p:
            assert p.request("flow-prod", "logs.app", {"n": 0})
            seq = client.info().last
            client.progress(journal, seq, name)
            wait_for(lambda: "test/worker-0" in metric_text(dev), timeout=10, what="the report to arrive")
            assert p.request("flow-prod", "logs.app", {"n": 1})  # published now: the importer is 0 s behind
            time.sleep(1.5)  # ... and never reports it: over a second behind
            p.submit("flow-prod", "logs.app", {"n": 2})
            assert not answered(p), "input waits while an in-sync importer lags"
            # Reporting the newest seq lets input through again; the waiting request gets its 202.
            client.progress(journal, client.info().last, name)
            wait_for(lambda: answered(p), timeout=10, what="the held request to be answered")
            # An importer that keeps reporting but stays behind is waited for at most --importer-evict-after.
            time.sleep(1.5)
            started = time.monotonic()
            p.submit("flow-prod", "logs.app", {"n": 3})

            def evicted() -> bool:
                client.progress(journal, seq, name)
                return answered(p)
            wait_for(evicted, timeout=30, what="the stuck importer to be evicted")
            assert time.monotonic() - started >= 4
    finally:
        client.close()
    assert stop(dev.proc) == 0
