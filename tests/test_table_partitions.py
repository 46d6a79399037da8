"""No stream can wedge an importer: names at the device's limits, the day's cap of new streams, quarantine.

Through a real logjam-device, the real Producer, a real logjam-importer and its Delta table,
read back with delta-rs. Every name the device accepts lands, and `WHERE app_env = '<name>'` (or
`original_app_env`, for a stand-in partition) finds its rows; a stream whose directory is in
the way is quarantined while the others keep landing; a write that fails for every stream
makes /healthz unhealthy with its cause and lands everything once the cause is gone.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from deltalake import DeltaTable

from table.paths import MAX_DIR_NAME, OVERFLOW, QUARANTINE, partition_dir
from logjam.producer import Producer
from harness.processes import wait_for
from tests import table_support
from tests.test_health import healthz
from tests.test_importer import Importer

NAMES = [
    "a-" + "x" * 253,  # 255 bytes: `app_env=` plus the name is longer than a file name may be
    "a-" + "%" * 253,  # escaped, longer than the metastore keeps a partition name: a stand-in value
    "quo'te\"s-prod",
    "back\\slash-prod",
    "per%cent-prod",
    "equ=als-prod",
    "sla/sh-prod",
    "sp ace-prod",
    "plain-prod",
]


def sent_rows(device, names: list[str], per: int) -> int:
    with Producer(device.router) as p:
        for name in names:
            for i in range(per):
                p.submit(name, "logs.test", {"message": f"{name[:20]} {i}"})
        assert p.flush().accepted == per * len(names)
    return per * len(names)


def named(warehouse: Path, name: str) -> int:
    """Rows found by a stream's name: in its own partition, or in a stand-in with the name in original_app_env."""
    return sum(1 for r in table_support.rows(warehouse, columns=["app_env", "original_app_env"])
               if name in (r.app_env, r.original_app_env))


def in_partition(warehouse: Path, app_env: str) -> list:
    return table_support.rows(warehouse, [app_env])


def rows_sent_here(warehouse: Path) -> int:
    return sum(1 for r in table_support.rows(warehouse, columns=["topic"]) if r.topic == "logs.test")


@pytest.mark.timeout(300)
def test_every_name_the_device_accepts_lands_and_is_found_by_its_name(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, "--flush-interval", "0.5", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        # The device's own limit: it refuses a name with bytes beyond ASCII (400), so none reaches the table.
        with Producer(device.router) as p:
            p.submit("caf\u00e9-prod", "logs.test", {"message": "x"})
            assert p.flush().accepted == 0
        total = sent_rows(device, NAMES, 3)
        wait_for(lambda: rows_sent_here(warehouse) >= total, timeout=120, interval=0.5, what=f"{total} rows")
        assert rows_sent_here(warehouse) == total
        for name in NAMES:
            assert named(warehouse, name) == 3, f"{name[:30]!r}: rows found by name"
        assert not in_partition(warehouse, NAMES[0]), "a name too long for a directory gets a stand-in partition"
        for top, _dirs, files in os.walk(warehouse):
            for entry in [*_dirs, *files]:
                assert len(entry.encode()) <= 255, entry
        assert any(d.startswith("app_env=~") for d in os.listdir(warehouse / "messages"))
    finally:
        assert imp.stop() == 0, imp.output()


@pytest.mark.timeout(300)
def test_new_streams_past_the_days_cap_land_in_the_overflow_partition(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, "--flush-interval", "0.5", "--max-new-app-envs", "3", warehouse=warehouse)
    try:
        imp.wait_ready(device)  # the probe stream is the day's first partition
        names = [f"burst{i}-prod" for i in range(6)]
        total = sent_rows(device, names, 2)
        wait_for(lambda: rows_sent_here(warehouse) >= total, timeout=120, interval=0.5, what=f"{total} rows")
        parts = [p["app_env"] for p in DeltaTable(str(warehouse / "messages")).partitions()]
        assert len([p for p in parts if p.startswith("burst")]) == 2 and parts.count(OVERFLOW) == 1, parts
        assert len(in_partition(warehouse, OVERFLOW)) == 8
        for name in names:
            assert named(warehouse, name) == 2
        wait_for(lambda: imp.metric("logjam_importer_app_envs_overflowed_total") == 4, timeout=10,
                 what="the overflow metric")
    finally:
        assert imp.stop() == 0, imp.output()
    assert "--max-new-app-envs" in imp.output()


def in_the_way(warehouse: Path, app_env: str) -> Path:
    """A file where the stream's partition directory has to go: every write of its rows fails."""
    day = datetime.datetime.now(datetime.timezone.utc).date()  # the Producer stamps messages now
    path = Path(partition_dir(str(warehouse / "messages"), app_env, day.isoformat())).parent
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("in the way")
    return path


@pytest.mark.timeout(420)
def test_a_stream_that_cannot_be_written_is_quarantined_and_the_others_land(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, "--flush-interval", "0.5", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        in_the_way(warehouse, "poison-prod")
        total = sent_rows(device, ["poison-prod", "good-prod", "fine-prod"], 5)
        wait_for(lambda: rows_sent_here(warehouse) >= total, timeout=240, interval=1, what=f"{total} rows")
        assert len(in_partition(warehouse, "good-prod")) + len(in_partition(warehouse, "fine-prod")) == 10
        quarantined = in_partition(warehouse, QUARANTINE)
        assert [r.original_app_env for r in quarantined] == ["poison-prod"] * 5
        assert imp.metric("logjam_importer_rows_quarantined_total") == 5
        status, doc = healthz(imp.metrics_port)
        assert status == 503 and doc["checks"]["quarantine"]["ok"] is False, doc
    finally:
        assert imp.stop() == 0, imp.output()
    out = imp.output()
    assert "quarantin" in out and "poison-prod" in out


@pytest.mark.timeout(420)
def test_writes_failing_for_every_stream_turn_healthz_unhealthy_and_land_once_mended(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    # --unhealthy-after 2: /healthz turns unhealthy after 2 s of failing writes instead of the default 10 s,
    # so the cause is mended while the writer's retries are seconds apart, not at their 10 s cap.
    imp = Importer(device, "--flush-interval", "0.5", "--write-timeout", "30", "--unhealthy-after", "2",
                   warehouse=warehouse)
    try:
        imp.wait_ready(device)
        wait_for(lambda: in_partition(warehouse, "probe-ready"), timeout=60, what="the probe rows")
        # Every stream of the batch is in the way: nothing can be singled out, so nothing is
        # quarantined, and the writes are waited out.
        names = ["one-prod", "two-prod"]
        blocked = [in_the_way(warehouse, n) for n in names]
        total = sent_rows(device, names, 4)
        status, doc = wait_for(lambda: (r := healthz(imp.metrics_port))[0] == 503 and r, timeout=60,
                               what="/healthz to say the writes fail")
        assert "writes failing" in doc["checks"]["writes"]["detail"], doc
        for path in blocked:
            path.unlink()
        wait_for(lambda: rows_sent_here(warehouse) >= total, timeout=120, interval=0.25, what="the rows once the path is free")
        assert rows_sent_here(warehouse) == total
        assert not in_partition(warehouse, QUARANTINE)
        wait_for(lambda: healthz(imp.metrics_port)[0] == 200, timeout=30, what="/healthz healthy again")
    finally:
        assert imp.stop() == 0, imp.output()


def test_directory_names_stay_within_the_limit() -> None:
    for name in NAMES:
        assert len(Path(partition_dir("/r", name, "2026-01-01")).parent.name.encode()) <= MAX_DIR_NAME


@pytest.mark.timeout(420)
def test_a_full_warehouse_disk_is_named_in_the_log_and_healthz_and_nothing_is_lost(device, tmp_path) -> None:
    from tests.disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        warehouse = disk / "wh"
        # --unhealthy-after 2: as in the failing-writes test above.
        imp = Importer(device, "--flush-interval", "0.5", "--write-timeout", "30",
                       "--unhealthy-after", "2", warehouse=warehouse, state_dir=tmp_path / "state")
        try:
            imp.wait_ready(device)
            wait_for(lambda: in_partition(warehouse, "probe-ready"), timeout=60, what="the probe rows")
            filler = fill(disk, 0)
            total = sent_rows(device, ["full-prod"], 200)
            status, doc = wait_for(lambda: (r := healthz(imp.metrics_port))[0] == 503 and r, timeout=60,
                                   what="/healthz to say the writes fail")
            assert "disk full" in doc["checks"]["writes"]["detail"], doc
            filler.unlink()
            wait_for(lambda: len(in_partition(warehouse, "full-prod")) >= total, timeout=120, interval=0.25,
                     what="the rows once there is room")
            assert len(in_partition(warehouse, "full-prod")) == total
        finally:
            assert imp.stop() == 0, imp.output()
    assert "disk full: " in imp.output()
