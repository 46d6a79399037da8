"""An importer killed with SIGKILL at each step of its commit, against real things: a journaled
logjam-device, a real Producer counting its 202s, real importer processes, the real Delta table.

The steps, each seen on the filesystem (or in the importer's log) and the importer stopped with
SIGSTOP the moment it shows, checked, then killed:
- `files-written`: a data file of a batch is on disk and no log entry names it yet (its commit not
  made); an attempt that finds the commit already made lets the importer go on and waits for the
  next batch;
- `log-written`: a new `_delta_log/NNN.json` (the batch's commit, with its txn) just appeared;
- `txn-read`: an importer restarted after a kill has just read its device's landed txn (its log line
  "device 1: resuming journal ... after seq N") and has committed nothing since.

Then an importer starts again while the Producer keeps sending, and every acknowledged event must be
in the table exactly once; a reader polling the table twice a second all along, with a fresh
snapshot each time, must never have seen a row vanish or doubled (tests/table_watch.py).
"""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path

import pytest

from harness.processes import wait_for
from table.paths import table_path
from tests.table_watch import LogWatch, PollingReader, freeze_when, kill_9, parquet_on_disk
from tests.test_importer import Importer
from tests.test_importer_recovery import Journaled, Load, landed, wait_landed

RESUMED = re.compile(r"device 1: resuming journal (\S+) after seq (\d+) \(the table's app transaction\)")


class TeedImporter(Importer):
    """An Importer whose output is read as it prints (a test waits for one of its log lines)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lines: list[str] = []
        self._tee = threading.Thread(target=self._read, daemon=True)
        self._tee.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def output(self) -> str:
        if self.proc.poll() is not None:
            self._tee.join(10)
        return self.text()


def start_importer(j: Journaled, warehouse: Path, state: Path, *, ready: bool = True) -> TeedImporter:
    imp = TeedImporter(j.dev, "--flush-interval", "0.5", "--replay-port", str(j.replay_port), "--replay-timeout", "5",
                       warehouse=warehouse, state_dir=state)
    if ready:
        imp.wait_ready(j.dev)
    return imp


def landed_txns(log: LogWatch) -> dict[str, int]:
    """appId -> the highest txn version the log holds for it."""
    out: dict[str, int] = {}
    for v in sorted(log.scan().entries):
        for app, version in log.txns(v).items():
            out[app] = max(out.get(app, -1), version)
    return out


def kill_at_files_written(imp: Importer, location: str) -> str:
    """SIGKILL `imp` while a batch's data file is on disk and its commit is not in the log."""
    log = LogWatch(location)
    for attempt in range(1, 200):
        # Files first, then the log: a file whose commit lands between the two reads is named, not taken.
        unnamed = freeze_when(imp.proc, lambda: parquet_on_disk(location) - log.scan().added(), timeout=30,
                              what="a data file no log entry names")
        still = set(unnamed) - log.scan().added()  # type: ignore[arg-type]
        if still:
            kill_9(imp.proc)
            assert still - log.scan().added(), "the commit landed after the kill"
            return f"attempt {attempt}: killed with {len(still)} uncommitted files, e.g. {sorted(still)[0]}"
        imp.proc.send_signal(signal.SIGCONT)  # the commit had landed before the stop: the next batch
    raise AssertionError("never caught an importer between writing a batch's files and committing it")


def kill_at_log_written(imp: Importer, location: str) -> str:
    log = LogWatch(location)
    base = log.scan().latest()
    version = freeze_when(imp.proc, lambda: log.scan().latest() > base and log.latest(), timeout=30,
                          what="a new log entry")
    kill_9(imp.proc)
    txns = log.txns(version)  # type: ignore[arg-type]
    assert txns, f"version {version} carries no txn: {log.entries[version]}"  # type: ignore[index]
    return f"killed right after version {version} appeared, txns {txns}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("step", ["files-written", "log-written", "txn-read"])
def test_kill_9_at_a_step_of_the_commit_then_every_acked_event_once(tmp_path: Path, step: str) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", f"crash-{step}"
    location = table_path(str(warehouse))
    j = Journaled(tmp_path / "dev")
    imps: list[TeedImporter] = []
    load: Load | None = None
    reader = PollingReader(location, ["journal", "seq"], filters=[("app_env", "=", app_env)])
    try:
        imps.append(start_importer(j, warehouse, state))
        load = Load(j.dev, app_env)
        wait_for(lambda: imps[0].metric("logjam_importer_rows_written_total") >= 300, timeout=60,
                 what="the importer to commit under load")
        if step == "files-written":
            what = kill_at_files_written(imps[0], location)
        elif step == "log-written":
            what = kill_at_log_written(imps[0], location)
        else:
            kill_9(imps[0].proc)
            imps.append(start_importer(j, warehouse, state, ready=False))
            seen = freeze_when(imps[1].proc, lambda: RESUMED.search(imps[1].text()), timeout=60,
                               what="the restarted importer to read its txn")
            before = LogWatch(location).scan().latest()
            kill_9(imps[1].proc)
            assert LogWatch(location).scan().latest() == before
            what = f"killed right after {seen.group(0)!r}"  # type: ignore[union-attr]
        print(f"{step}: {what}")
        held = landed_txns(LogWatch(location))
        orphans = parquet_on_disk(location) - LogWatch(location).scan().added()
        # Acknowledged events pile up in the journal while no importer runs, then the last one catches up.
        at_kill = load.acked
        wait_for(lambda: load.acked >= at_kill + 200, timeout=30, interval=0.05, what="load while no importer runs")
        imps.append(start_importer(j, warehouse, state))
        # Live load across the switch from catching up to live, over a few of its commits.
        until = load.acked + 1000
        wait_for(lambda: load.acked >= until and imps[-1].metric("logjam_importer_batches_written_total") >= 4,
                 timeout=60, interval=0.05, what="load and commits after the restart")
        acked = load.finish()
        ns = wait_landed(warehouse, app_env, acked, timeout=60)
        _, rows, seqs = landed(warehouse, app_env)
        wait_for(lambda: reader.most >= acked, timeout=10, interval=0.1, what="the reader to see every row")
        reader.check(min_polls=5)
        print(f"{step}: acked {acked}, landed {rows} rows ({seqs} distinct seqs); {reader.summary()}; "
              f"txns at the kill {held}; {len(orphans)} uncommitted files left by the kill")
        assert sorted(ns) == list(range(acked)), "every acknowledged event exactly once"
        assert rows == seqs == acked
        final = imps[-1]
        assert final.metric("logjam_importer_gap_messages_total") <= 0
        assert final.metric("logjam_importer_lost_messages_total") <= 0
        # What the kill left uncommitted stays out of the table: no log entry ever names it.
        assert not orphans & LogWatch(location).scan().added()
        if step == "files-written":
            assert orphans
    finally:
        reader.stop()
        if load is not None:
            load.finish()
        for imp in imps:
            if imp.proc.poll() is None:
                assert imp.stop() == 0, imp.output()[-3000:]
        j.close()
    # The importer after the kill resumed exactly after the txn the table held.
    resumed = RESUMED.search(imps[-1].output())
    assert resumed, imps[-1].output()[-3000:]
    # (Without --own-devices the txn is the importer's share: logjam:<journal>:importer-0.)
    txn = [v for app, v in held.items() if app.split(":")[1] == resumed.group(1)]
    assert [int(resumed.group(2))] == txn, (resumed.group(0), held)
