"""Journal identity against real things: a device whose journal was wiped, and two devices sharing one id.

Sequence numbers start again at 1 in a new journal; an importer that compared them with
the old journal's position would drop every new message as a duplicate. Devices announce
their journal's id, each journal's progress is its own app transaction in the table, and the
importer reads a new journal from its first seq: a running importer sees the change, a
restarted one finds nothing of the new journal in the table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.device import start_device
from harness.processes import free_port, stop, wait_for
from tests.test_importer_recovery import Journaled, importer, landed, send_numbered, wait_landed


def restart_wiped(j: Journaled, data_dir: Path) -> None:
    """Stop the device, delete its data dir (a new disk, a new host), start it again on the same ports."""
    dev = j.dev
    assert stop(dev.proc) == 0, dev.output()
    shutil.rmtree(data_dir)
    ports = {"router": dev.router_port, "pull": dev.pull_port, "pub": dev.pub_port, "stats": dev.stats_port}
    j.dev = start_device(ports=ports, extra=["--data-dir", str(data_dir), "--replay-port", str(j.replay_port),
                                             "--metrics-port", str(j.metrics_port), "--heartbeat-interval", "1"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("importer_during_reset", ["running", "stopped"])
def test_a_wiped_journal_is_read_from_its_first_seq(tmp_path, importer_during_reset) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", f"journal-{importer_during_reset}"
    data_dir = tmp_path / "dev"
    j = Journaled(data_dir)
    imp = importer(j, warehouse, state)
    try:
        send_numbered(j.dev, app_env, range(0, 500))
        wait_landed(warehouse, app_env, 500)
        if importer_during_reset == "stopped":
            assert imp.stop() == 0, imp.output()
        restart_wiped(j, data_dir)
        # The new journal's numbers lie below what the importer has covered.
        send_numbered(j.dev, app_env, range(500, 800))
        if importer_during_reset == "stopped":
            imp = importer(j, warehouse, state)
        ns = wait_landed(warehouse, app_env, 800)
        _, rows, _ = landed(warehouse, app_env)
        assert sorted(ns) == list(range(800)) and rows == 800, "every acknowledged event once, none dropped"
        assert imp.metric("logjam_importer_journal_changes_total") == (1 if importer_during_reset == "running" else 0)
        assert imp.metric("logjam_importer_duplicate_events_total") <= 0
    finally:
        imp.stop()
        j.close()
    assert ("serves a new journal" if importer_during_reset == "running" else "has nothing in the table") in imp.output()


@pytest.mark.timeout(180)
def test_two_live_devices_with_one_id_are_reported(tmp_path) -> None:
    a = Journaled(tmp_path / "a")
    b_replay = free_port()
    b = start_device(extra=["--data-dir", str(tmp_path / "b"), "--replay-port", str(b_replay),
                            "--heartbeat-interval", "1"])
    imp = importer(a, tmp_path / "wh", tmp_path / "state", "--sub", b.pub)
    try:
        wait_for(lambda: imp.metric("logjam_importer_duplicate_device_ids_total") > 0, timeout=60, interval=0.5,
                 what="the importer to notice two journals under device id 1")
    finally:
        imp.stop()
        assert stop(b.proc) == 0, b.output()
        a.close()
    assert "device id 1 is used by two live devices" in imp.output()
