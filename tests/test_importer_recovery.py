"""Importer recovery against real things: a journaled logjam-device, real Producers, real importers, the real table.

Each test stops, kills, pauses or starves a real `logjam-importer` process under load and
then counts rows per seq in the Delta table: every message the device acknowledged (a 202) must
land exactly once, and what the journal no longer has must be counted as lost.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from logjam.producer import Producer
from logjam.replay import Lost, ReplayClient
from harness.device import DeviceProcess, start_device
from harness.processes import free_port, stop, wait_for
from tests.test_importer import Importer, read_rows

PAD = "x" * 200
PAUSE = float(os.environ.get("LOGJAM_RECOVERY_PAUSE", "12"))


class Journaled:
    """A device with `--data-dir` and its replay port."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.replay_port = free_port()
        self.metrics_port = free_port()
        self.dev: DeviceProcess = start_device(extra=[
            "--data-dir", str(data_dir), "--replay-port", str(self.replay_port),
            "--metrics-port", str(self.metrics_port), "--heartbeat-interval", "1", *extra])

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return -1.0

    def close(self) -> None:
        assert stop(self.dev.proc) == 0, self.dev.output()


class Load:
    """A real Producer (DEALER) submitting numbered events in pipelined rounds; counts the 202s."""

    def __init__(self, device: DeviceProcess, app_env: str, per_round: int = 50, pause: float = 0.02) -> None:
        self.device = device
        self.app_env = app_env
        self.per_round = per_round
        self.pause = pause
        self.acked = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with Producer(self.device.router, timeout=10) as p:
                while not self._stop.is_set():
                    for i in range(self.per_round):
                        p.submit(self.app_env, "logs.app", {"n": self.acked + i, "pad": PAD})
                    result = p.flush()
                    # Every round is acknowledged whole, so events 0..acked-1 are exactly the acked ones.
                    assert (result.accepted, result.rejected) == (self.per_round, 0), result
                    self.acked += self.per_round
                    self._stop.wait(self.pause)  # pacing, keeps the load steady rather than flat out
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self) -> int:
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, self.error
        return self.acked


def landed(warehouse: Path, app_env: str) -> tuple[list[int], int, int]:
    """(the event numbers in the table, rows, distinct seqs) for `app_env`."""
    rows = read_rows(warehouse, [app_env])
    return [orjson.loads(r.body)["n"] for r in rows], len(rows), len({r.seq for r in rows})


def wait_landed(warehouse: Path, app_env: str, expected: int, timeout: float = 120) -> list[int]:
    result: list[int] = []

    def enough() -> bool:
        nonlocal result
        result, rows, _ = landed(warehouse, app_env)
        return rows >= expected

    wait_for(enough, timeout=timeout, interval=1.0, what=f"{expected} rows of {app_env} in the table")
    return result


def send_numbered(dev: DeviceProcess, app_env: str, numbers: range, chunk: int = 100) -> None:
    """Events {"n": i} through a real Producer, each chunk acknowledged whole."""
    with Producer(dev.router, timeout=10) as p:
        for start in range(numbers.start, numbers.stop, chunk):
            part = range(start, min(start + chunk, numbers.stop))
            for i in part:
                p.submit(app_env, "logs.app", {"n": i, "pad": PAD})
            assert p.flush().accepted == len(part)


def importer(j: Journaled, warehouse: Path, state: Path, *extra: str) -> Importer:
    imp = Importer(j.dev, "--flush-interval", "0.5", "--replay-port", str(j.replay_port),
                   "--replay-timeout", "5", *extra, warehouse=warehouse, state_dir=state)
    imp.wait_ready(j.dev)
    return imp


def last_seq(warehouse: Path, app_env: str) -> int:
    """The highest seq of `app_env` in the table: where a restarted importer resumes (heartbeats aside)."""
    return max(r.seq for r in read_rows(warehouse, [app_env]))


@pytest.mark.timeout(300 + PAUSE)
@pytest.mark.parametrize("how", ["sigterm-pause", "sigkill"])
def test_stopped_or_killed_importer_catches_up_exactly_once(tmp_path, how) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", f"recover-{how}"
    j = Journaled(tmp_path / "dev")
    imps: list[Importer] = []
    load: Load | None = None
    try:
        imps.append(importer(j, warehouse, state))
        load = Load(j.dev, app_env)
        wait_for(lambda: imps[0].metric("logjam_importer_rows_written_total") >= 500, timeout=60,
                 what="the importer to commit under load")
        if how == "sigkill":
            imps[0].proc.send_signal(signal.SIGKILL)
            imps[0].proc.wait(10)
        else:
            assert imps[0].stop() == 0, imps[0].output()
            # The importer stays away while the load goes on (the issue asks for 60 s; the default is
            # shorter to keep the suite quick, LOGJAM_RECOVERY_PAUSE=60 runs the full length): a backlog
            # of acknowledged events that only the journal holds.
            at_stop, stopped = load.acked, time.monotonic()
            wait_for(lambda: time.monotonic() - stopped >= PAUSE and load.acked >= at_stop + 5000,
                     timeout=PAUSE + 60, interval=0.1, what="a backlog under load")
            print(f"importer away for {time.monotonic() - stopped:.1f}s, backlog {load.acked - at_stop} events")
        imps.append(importer(j, warehouse, state))
        wait_for(lambda: imps[1].metric("logjam_importer_replayed_messages_total") > 0, timeout=60,
                 what="the restarted importer to replay")
        # Keep the load going across the switch from replay to live.
        until = load.acked + 1000
        wait_for(lambda: load.acked >= until, timeout=60, interval=0.1, what="more load after the restart")
        acked = load.finish()
        ns = wait_landed(warehouse, app_env, acked)
        _, rows, seqs = landed(warehouse, app_env)
        restarted = imps[1]
        lost = restarted.metric("logjam_importer_lost_messages_total")
        gaps = restarted.metric("logjam_importer_gap_messages_total")
        replayed = restarted.metric("logjam_importer_replayed_messages_total")
        print(f"{how}: sent and acked {acked}, landed {rows} rows ({seqs} distinct seqs), "
              f"duplicates {rows - seqs}, lost {lost}, unreplayable gaps {gaps}, replayed {replayed}")
        assert sorted(ns) == list(range(acked)), "every acknowledged event exactly once"
        assert rows == seqs == acked
        assert lost <= 0 and gaps <= 0
        assert restarted.metric("logjam_importer_recovered_gaps_total") >= 1
    finally:
        if load is not None:
            load.finish()
        for imp in imps:
            if imp.proc.poll() is None:
                assert imp.stop() == 0, imp.output()
        j.close()
    print("\n".join(line for line in imps[-1].output().splitlines() if "resuming" in line or "interrupted" in line))
    assert re.search(r"device 1: resuming journal \S+ after seq \d+ \(the table's app transaction\)", imps[1].output())


@pytest.mark.timeout(240)
def test_a_live_gap_from_a_paused_importer_is_filled_through_replay(tmp_path) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", "recover-gap"
    # Tiny high-water marks on both sides: a paused subscriber loses messages on PUB/SUB.
    j = Journaled(tmp_path / "dev", "-S", "50")
    imp = importer(j, warehouse, state, "--rcvhwm", "50")
    try:
        imp.proc.send_signal(signal.SIGSTOP)
        big = "y" * 2000
        total = 4000
        with Producer(j.dev.router) as p:
            for i in range(total):
                p.submit(app_env, "logs.app", {"n": i, "pad": big})
                if i % 200 == 199:
                    assert p.flush().accepted == 200
        imp.proc.send_signal(signal.SIGCONT)
        ns = wait_landed(warehouse, app_env, total)
        _, rows, seqs = landed(warehouse, app_env)
        replayed = imp.metric("logjam_importer_replayed_messages_total")
        print(f"gap: sent and acked {total}, landed {rows} ({seqs} distinct seqs), replayed {replayed}")
        assert replayed > 0, "PUB/SUB dropped nothing: the test did not create a gap"
        assert imp.metric("logjam_importer_recovered_gaps_total") >= 1
        assert sorted(ns) == list(range(total)) and rows == seqs == total
        assert imp.metric("logjam_importer_lost_messages_total") <= 0
        assert imp.metric("logjam_importer_gap_messages_total") <= 0
    finally:
        if imp.proc.poll() is None:
            imp.proc.send_signal(signal.SIGCONT)
        assert imp.stop() == 0, imp.output()
        j.close()


@pytest.mark.timeout(240)
def test_a_range_past_retention_is_counted_lost_and_the_importer_moves_on(tmp_path) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", "recover-retention"
    # Rare heartbeats: the journal must not roll over on its own while the test compares it with the table.
    j = Journaled(tmp_path / "dev", "--journal-segment-bytes", "4096", "--journal-retention-bytes", "16384",
                  "--heartbeat-interval", "30")
    imp = importer(j, warehouse, state)
    try:
        with Producer(j.dev.router) as p:
            for i in range(100):
                p.submit(app_env, "logs.app", {"n": i, "pad": PAD})
            assert p.flush().accepted == 100
        wait_landed(warehouse, app_env, 100)
        assert imp.stop() == 0, imp.output()
        resume = last_seq(warehouse, app_env)
        with Producer(j.dev.router) as p:
            for i in range(100, 2100):
                p.submit(app_env, "logs.app", {"n": i, "pad": PAD})
                if i % 200 == 99:
                    assert p.flush().accepted == 200
            # A short tail stays in the segment being written, which retention never deletes.
            for i in range(2100, 2110):
                p.submit(app_env, "logs.app", {"n": i, "pad": PAD})
            assert p.flush().accepted == 10
        wait_for(lambda: 0 < j.metric("logjam_device_journal_bytes") <= 16384, timeout=30,
                 what="retention to delete what the importer has not seen")
        assert j.metric("logjam_device_journal_first_seq") > resume + 1
        # What the journal still has, as the importer's replay will see it.
        client = ReplayClient(f"tcp://127.0.0.1:{j.replay_port}", timeout=5)
        answer = list(client.fetch(resume + 1, 2**62))
        client.close()
        gone = sum(a.count for a in answer if isinstance(a, Lost))
        kept = sorted(orjson.loads(m.body)["n"] for m in answer if not isinstance(m, Lost) and m.app_env == app_env)
        assert gone > 0 and kept

        imp = importer(j, warehouse, state)
        with Producer(j.dev.router) as p:
            for i in range(2110, 2160):
                p.submit(app_env, "logs.app", {"n": i, "pad": PAD})
            assert p.flush().accepted == 50
        # The new messages roll journal segments, so retention may delete some of `kept`
        # before the importer's catch-up reads them (it starts on the first live message):
        # those must then be counted lost too. Nothing may be missing without being counted.
        tail = set(range(2110, 2160))

        def tail_landed() -> list[int] | None:
            ns, _, _ = landed(warehouse, app_env)
            return ns if tail <= set(ns) else None

        ns = wait_for(tail_landed, timeout=120, interval=1.0, what="the messages sent after the restart in the table")
        _, rows, seqs = landed(warehouse, app_env)
        lost = imp.metric("logjam_importer_lost_messages_total")
        middle = set(ns) - set(range(100)) - tail
        print(f"retention: acked 2160, gone from the journal {gone} (then more: {len(set(kept) - middle)} of the "
              f"{len(kept)} kept), landed {rows} ({seqs} distinct), lost {lost}")
        assert rows == seqs and set(range(100)) <= set(ns)
        assert middle <= set(kept), "only what the journal still had may land"
        assert lost >= gone + len(set(kept) - middle), "everything acked that did not land is counted lost"
        # ... and nothing more: what the importer counted lost is only what was gone.
        assert lost <= gone + len(set(kept) - middle) + 2, "lost more than retention deleted (2 heartbeats of slack)"
    finally:
        if imp.proc.poll() is None:
            assert imp.stop() == 0, imp.output()
        j.close()
        print(imp.output()[-3000:])
    assert "are gone from its journal (retention)" in imp.output()


@pytest.mark.timeout(240)
def test_a_long_replay_is_committed_in_pieces(tmp_path) -> None:
    """A backlog replayed at start is committed as the loop commits live traffic, not as one batch
    at its end: an importer killed every half minute still gets through a replay of many minutes."""
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", "recover-pieces"
    j = Journaled(tmp_path / "dev")
    total = 3000
    try:
        send_numbered(j.dev, app_env, range(total))  # before any importer: all of it comes by replay
        imp = importer(j, warehouse, state, "--batch-rows", "500")
        try:
            ns = wait_landed(warehouse, app_env, total)
            _, rows, seqs = landed(warehouse, app_env)
            assert sorted(ns) == list(range(total)) and rows == seqs == total
            assert imp.metric("logjam_importer_replayed_messages_total") >= total
            batches = imp.metric("logjam_importer_batches_written_total")
            print(f"replayed {total} messages in {batches:.0f} batches")
            assert batches >= total // 500 - 1, batches
        finally:
            assert imp.stop() == 0, imp.output()
    finally:
        j.close()
