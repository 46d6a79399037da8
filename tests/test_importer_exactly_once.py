"""Exactly-once landing of events the device journaled twice, against real things.

A real journaled `logjam-device` gives each copy of an event its own seq; a real
`logjam-importer` must land it once because both copies carry the same `@metadata._id`,
also across a SIGKILL (the key memory is reloaded from the table's newest rows); rows are
counted in the table.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from logjam.producer import Producer
from harness.processes import wait_for
from tests import table_support
from tests.test_importer import Importer
from tests.test_importer_recovery import Journaled, importer


def table(warehouse: Path, app_envs: list[str]) -> list:
    """(app_env, seq, event_id, body, parse_error) of every row of those streams, read from the table's log."""
    rows = table_support.rows(warehouse, app_envs, ["app_env", "seq", "event_id", "body", "parse_error"])
    return sorted(rows, key=lambda r: (r.app_env, r.seq))


def send(dev, app_env: str, *bodies: dict) -> None:
    """Submit each body as its own message (the device gives every one a new seq) and wait for the 202s."""
    with Producer(dev.router, timeout=10) as p:
        for body in bodies:
            p.submit(app_env, "logs.app", body)
        result = p.flush()
    assert (result.accepted, result.rejected) == (len(bodies), 0), result


def settle(warehouse: Path, dev, app_envs: list[str], marker: str) -> list:
    """Send a marker event after everything else and wait until it is in the table: the importer handles a
    device's messages in seq order, so then every earlier message has been written or skipped."""
    send(dev, app_envs[0], {"marker": marker})
    rows: list = []

    def marked() -> bool:
        nonlocal rows
        rows = table(warehouse, app_envs)
        return any(f'"marker":"{marker}"' in (r.body or "") for r in rows)

    wait_for(marked, timeout=90, interval=0.5, what=f"marker {marker} in the table")
    return rows


def keyed(key, n: int) -> dict:
    return {"n": n, "message": "resent by its bridge", "@metadata": {"_id": key, "protocol": "lumberjack"}}


@pytest.mark.timeout(240)
def test_copies_with_one_event_id_land_once_and_bodies_without_one_all_land(tmp_path) -> None:
    warehouse, state = tmp_path / "wh", tmp_path / "state"
    a, b = "dedupe-a-prod", "dedupe-b-prod"
    j = Journaled(tmp_path / "dev")
    imp = importer(j, warehouse, state)
    # The readiness probes sent before it subscribed were read from the journal's start (replayed).
    replayed_at_start = imp.metric("logjam_importer_replayed_messages_total")
    try:
        # Each copy in its own round trip, as a DeviceLink resend after a lost 202 would do it.
        send(j.dev, a, keyed("lj-1f3a:7", 1))
        send(j.dev, a, keyed("lj-1f3a:7", 1))
        send(j.dev, a, keyed(4711, 2), keyed(4711, 2), keyed("4711", 2))  # an int id is its decimal text
        send(j.dev, b, keyed("lj-1f3a:7", 3))  # the same id in another stream is another event
        send(j.dev, a, *({"n": 4, "message": "same body, no id"} for _ in range(5)))
        send(j.dev, a, *(keyed("x" * 600, 5) for _ in range(2)))  # too long to be a key: not deduplicated
        rows = settle(warehouse, j.dev, [a, b], "one")
        mine = [r for r in rows if "marker" not in r.body]
        ids = [(r.app_env, r.event_id) for r in mine]
        print(f"{len(mine)} rows: {ids}")
        assert ids.count((a, "lj-1f3a:7")) == 1
        assert ids.count((a, "4711")) == 1
        assert ids.count((b, "lj-1f3a:7")) == 1
        assert ids.count((a, None)) == 5 + 2
        assert len(mine) == 10
        assert len({(r.app_env, r.seq) for r in rows}) == len(rows)
        assert imp.metric("logjam_importer_duplicate_events_total") == 3
        assert imp.metric("logjam_importer_duplicate_events_total", app_env=a) == 3
        # A skipped copy is covered like a filtered message: no gap, nothing replayed, the checkpoint moves on.
        assert imp.metric("logjam_importer_gap_messages_total") <= 0
        assert imp.metric("logjam_importer_replayed_messages_total") <= replayed_at_start
    finally:
        assert imp.stop() == 0, imp.output()
        j.close()
        print(imp.output())
    assert "duplicate events skipped: 3" in imp.output()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("second_copy", ["after-restart", "while-down"])
def test_a_copy_sent_after_a_sigkill_still_lands_once(tmp_path, second_copy) -> None:
    warehouse, state, app_env = tmp_path / "wh", tmp_path / "state", f"dedupe-kill-{second_copy}"
    j = Journaled(tmp_path / "dev")
    imps: list[Importer] = [importer(j, warehouse, state)]
    # Bridge-style keys of a few protocols, plus events that never had a key.
    keys = ["segment:store1:scope/stream/0.#epoch.0@4096", "rustlog:log7:events/1@42", "lj-9c2e:1", 17]
    try:
        send(j.dev, app_env, *(keyed(k, i) for i, k in enumerate(keys)), {"n": 99, "message": "no id"})
        wait_for(lambda: len(table(warehouse, [app_env])) >= len(keys) + 1, timeout=90, interval=0.5,
                 what="the first copies in the table")
        imps[0].proc.send_signal(signal.SIGKILL)
        imps[0].proc.wait(10)
        if second_copy == "while-down":
            # Journaled while no importer runs: the restarted one gets these through replay.
            send(j.dev, app_env, *(keyed(k, i) for i, k in enumerate(keys)))
        imps.append(importer(j, warehouse, state))
        if second_copy == "after-restart":
            send(j.dev, app_env, *(keyed(k, i) for i, k in enumerate(keys)))
        rows = [r for r in settle(warehouse, j.dev, [app_env], second_copy) if "marker" not in r.body]
        print(f"{second_copy}: {[(r.seq, r.event_id) for r in rows]}")
        assert sorted((r.event_id for r in rows), key=str) == sorted([str(k) for k in keys] + [None], key=str)
        assert imps[1].metric("logjam_importer_duplicate_events_total") == len(keys)
        if second_copy == "while-down":
            assert imps[1].metric("logjam_importer_replayed_messages_total") >= len(keys)
    finally:
        for imp in imps:
            if imp.proc.poll() is None:
                assert imp.stop() == 0, imp.output()
        j.close()
    out = imps[1].output()
    print("\n".join(line for line in out.splitlines() if "dedupe:" in line or "resuming" in line))
    assert f"dedupe: remembering up to 1000000 event ids; {len(keys)} loaded" in out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("table", ["row tracking", "earlier format"])
def test_an_importer_refuses_a_table_it_cannot_keep_and_says_why(tmp_path, table) -> None:
    from deltalake import DeltaTable, TableFeatures

    from table.delta import open_table

    warehouse = tmp_path / "wh"
    if table == "row tracking":
        # As a Spark user's ALTER TABLE would: a writer feature delta-rs does not keep.
        open_table(str(warehouse / "messages"))
        DeltaTable(str(warehouse / "messages")).alter.add_feature(TableFeatures.RowTracking, allow_protocol_versions_increase=True)
        expected = "rowTracking"
    else:
        (warehouse / "messages" / "importer=0" / "app_env=a-b").mkdir(parents=True)
        expected = "earlier Parquet format (importer=* directories, no _delta_log): stop the mesh and run `logjam-sql --migrate"
    j = Journaled(tmp_path / "dev")
    try:
        imp = Importer(j.dev, warehouse=warehouse, state_dir=tmp_path / "state")
        assert imp.proc.wait(60) == 1
        assert "cannot start" in imp.output() and expected in imp.output(), imp.output()
    finally:
        j.close()
