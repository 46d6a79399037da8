"""The whole mesh under the real supervisord, on test ports, end to end.

Events go in through all five bridges (pylogbeat, the real Beats-protocol client, for
Lumberjack; `logjam-send` for the others) and straight to the device over DEALER and
PUSH. `logjam-sql` must then show every event exactly once with the right app_env,
topic and @metadata, and every bridge event with its idempotency key in `event_id`.
Then one importer is SIGKILLed: supervisord must restart it, traffic sent afterwards
must land, and no key may have two rows. The real OTLP and syslog clients (the
OpenTelemetry SDK's exporters, the npm OTLP/JSON exporter, rsyslog's omrelp, `logger`) land
through the same mesh into the table.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from pylogbeat import PyLogBeatClient

from harness.processes import command, port_open, wait_for
from warehouse.spark_server import descendants
from tests.mesh_support import (
    EXPECTED_ROUTE, landed, repeated_event_ids, send_everywhere, wait_landed, wait_until_importing,
)

pytestmark = pytest.mark.timeout(600)

# @metadata._id per bridge (bridges/host/mapping.py, bridges/segment/bridge.py `add`,
# bridges/rustlog/bridge.py `_messages`): a random per-process prefix and a counter, or the
# event's position in the bridge's store (16 hex digits of store id).
KEY_FORMATS = {
    "lumberjack": lambda md: r"[0-9a-f]{16}:[1-9][0-9]*",
    "courier": lambda md: r"[0-9a-f]{16}:[1-9][0-9]*",
    "syslog": lambda md: r"[0-9a-f]{16}:[1-9][0-9]*",
    "segment": lambda md: rf"segment:[0-9a-f]{{16}}:{re.escape(md['segment'])}@{md['segment_offset']}",
    "rustlog": lambda md: rf"rustlog:[0-9a-f]{{16}}:{re.escape(md['topic'])}/{md['partition']}@{md['offset']}",
    # bridges/otlp/bridge.py `_map`: a digest of the request's bytes and the record's index in it.
    "otlp": lambda md: r"otlp:[0-9a-f]{24}:[0-9]+",
}


@pytest.fixture
def mesh(shared_mesh):
    """The run's shared mesh (tests/mesh_conftest_plugin.py): each test keeps to its own run id."""
    return shared_mesh


def test_events_from_every_path_land_exactly_once(mesh):
    run = f"run-{uuid.uuid4().hex[:10]}"
    n = 25
    expected = send_everywhere(mesh, run, n)
    rows = wait_landed(mesh, run, len(expected))
    assert len(rows) == len(expected), "duplicates landed"
    seen: dict[str, dict] = {}
    for row in rows:
        body = orjson.loads(row["body"])
        marker = body["message"]
        assert marker not in seen, f"{marker} landed twice"
        seen[marker] = row
        path = expected[marker]
        app_env, topic, protocol = EXPECTED_ROUTE[path]
        assert (row["app_env"], row["topic"]) == (app_env, topic), (marker, row)
        assert row["parse_error"] is None
        assert row["device"] in {mesh.device_id(k) for k in range(mesh.devices)}
        if protocol:
            md = body["@metadata"]
            assert md["protocol"] == protocol
            assert md["peer"].startswith("127.0.0.1:")
            # Every bridge keys its events (docs/reliability.md "Exactly once"); the column is that key.
            assert row["event_id"] is not None and row["event_id"] == md["_id"], (marker, row)
            assert re.fullmatch(KEY_FORMATS[protocol](md), row["event_id"]), (marker, row["event_id"], md)
        else:
            # Logjam clients' bodies go through untouched: no key unless the producer wrote one.
            assert "@metadata" not in body and row["event_id"] is None, (marker, row)
    assert set(seen) == set(expected)
    keyed = [row["event_id"] for row in seen.values() if row["event_id"] is not None]
    bridges = sum(1 for _, _, protocol in EXPECTED_ROUTE.values() if protocol)
    assert len(keyed) == len(set(keyed)) == bridges * n, "bridge events share an idempotency key"
    # Both importers wrote: each owns one device, and the bridges spread their events over both.
    assert {row["device"] for row in rows} == {mesh.device_id(k) for k in range(mesh.devices)}


@pytest.mark.disturbs_mesh
def test_killed_importer_is_restarted_and_later_traffic_lands(mesh):
    name = "logjam-importer:logjam-importer-0"
    old = mesh.pid(name)
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        state = mesh.states().get(name)
        return bool(state and state[0] == "RUNNING" and mesh.pid(name) not in (0, old))

    wait_for(restarted, timeout=60, interval=0.5, what="supervisord to restart the importer")
    run = f"after-{uuid.uuid4().hex[:10]}"
    wait_until_importing(mesh, f"{run} probe")
    expected = send_everywhere(mesh, run, 10)
    markers: list[str] = []

    def all_landed() -> bool:
        markers[:] = [m for m in (orjson.loads(r["body"])["message"] for r in landed(mesh, run)) if " probe " not in m]
        return set(expected) <= set(markers)

    wait_for(all_landed, timeout=120, interval=2, what="events sent after the restart to land")
    assert sorted(markers) == sorted(expected), "duplicates or strays landed"
    # The restarted worker reloaded the keys it had written and wrote none of them again.
    assert repeated_event_ids(mesh) == []


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (logjam-spark's JVM is its child)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def alive(pid: int) -> bool:
    """Whether `pid` runs (or is stopped); a zombie is dead, only not yet reaped by its new parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_8k_bodies_at_full_speed_land_without_running_out_of_memory(mesh):
    """30,000 events of 8 KiB through pylogbeat as fast as acks allow (issue: the JVM ran out of heap and
    an importer grew to 788 MiB): every one lands once, no process restarts, memory stays bounded."""
    run = f"big-{uuid.uuid4().hex[:8]}"
    names = ["logjam-spark", "logjam-importer:logjam-importer-0", "logjam-importer:logjam-importer-1"]
    pids = {n: mesh.pid(n) for n in names}
    peak = {n: rss_mib(p) for n, p in pids.items()}
    client = PyLogBeatClient("127.0.0.1", mesh.port("LOGJAM_LUMBERJACK_PORT"), ssl_enable=False, use_logging=False)
    client.connect()
    pad = "x" * 8000
    try:
        for w in range(30):
            client.send([{"message": f"{run} {w * 1000 + i}", "lines": pad} for i in range(1000)])
            peak = {n: max(peak[n], rss_mib(pids[n])) for n in names}
    finally:
        client.close()

    def landed_all() -> bool:
        for n in names:
            peak[n] = max(peak[n], rss_mib(pids[n]))
        return mesh.sql(f"SELECT count(*) AS n FROM messages WHERE message LIKE '{run} %'")[0]["n"] >= 30_000

    wait_for(landed_all, timeout=300, interval=2, what="30,000 8 KiB events in the table")
    rows = mesh.sql(f"SELECT count(*) AS n, count(DISTINCT message) AS d FROM messages WHERE message LIKE '{run} %'")
    assert rows == [{"n": 30_000, "d": 30_000}]
    assert {n: mesh.pid(n) for n in names} == pids, "no process restarted"
    assert "OutOfMemoryError" not in mesh.logs()
    # The JVM's heap is 2 GiB (logjam-spark --driver-memory); an importer holds at most two
    # 64 MiB batches (--batch-bytes) besides its SUB buffer.
    assert peak["logjam-spark"] < 3500, peak
    assert max(peak[n] for n in names[1:]) < 1200, peak


def beeline(mesh, query: str) -> list[list[str]]:
    """Rows of `query` through the HiveServer2 endpoint, with pyspark's own `beeline` (JDBC)."""
    env = dict(mesh.env, PATH=f"{Path(command('beeline')).parent}:{os.environ.get('PATH', '')}")
    res = subprocess.run([command("beeline"), "-u", f"jdbc:hive2://127.0.0.1:{mesh.port('LOGJAM_JDBC_PORT')}",
                          "-n", "test", "--silent=true", "--outputformat=csv2", "--showHeader=false", "-e", query],
                         capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # beeline echoes its prompt ("0: jdbc:hive2://...> ") before the first row when stdin is no terminal.
    lines = [re.sub(r"^\d+: jdbc:hive2://\S+> ?", "", line) for line in res.stdout.splitlines()]
    return [line.split(",") for line in lines if line.strip()]


def table_metrics(mesh) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{mesh.port('LOGJAM_TABLE_METRICS_PORT')}/metrics", timeout=5).read()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.decode().splitlines()
            if line.startswith("logjam_") and " " in line}


@pytest.mark.disturbs_mesh
def test_the_table_answers_jdbc_and_keeps_its_rows_across_a_spark_restart(mesh):
    run = f"jdbc-{uuid.uuid4().hex[:8]}"
    send_everywhere(mesh, run, 5)
    wait_landed(mesh, run, 5 * len(EXPECTED_ROUTE))
    count = int(beeline(mesh, "SELECT count(*) FROM logjam.messages")[0][0])
    assert count == mesh.sql("SELECT count(*) AS n FROM messages")[0]["n"]
    partitions = "SELECT DISTINCT app_env, CAST(date AS STRING) FROM logjam.messages ORDER BY 1, 2"
    before = beeline(mesh, partitions)
    assert before
    # make up's logjam-spark counts the table's partitions on --metrics-port (its first census at start).
    wait_for(lambda: table_metrics(mesh).get("logjam_table_partitions", 0) > 0, timeout=60,
             what="logjam-spark's table census")

    # The restart meets a hung JVM (stopped, not dead): logjam-spark kills it at its --stop-timeout
    # (20 s), and says so, before supervisord's stopwaitsecs (30 s) would kill the group unexplained.
    jvms = descendants(mesh.pid("logjam-spark"))
    assert jvms
    for pid in jvms:
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    mesh.ctl("stop", "logjam-spark")
    took = time.monotonic() - started
    assert 15 < took < 28, f"logjam-spark stopped {took:.1f}s after SIGTERM with its JVM hung"
    assert not [p for p in jvms if alive(p)], "the hung JVM (or a process it started) outlived logjam-spark"
    assert "has not stopped 20s after SIGTERM; killing it" in mesh.logs()
    mesh.ctl("start", "logjam-spark")
    wait_for(lambda: port_open(mesh.port("LOGJAM_JDBC_PORT")), timeout=180, interval=1, what="JDBC after restart")
    assert wait_for(lambda: beeline(mesh, partitions), timeout=60) == before
    # The importers reconnect by themselves, and later rows land.
    after = f"after-{uuid.uuid4().hex[:8]}"
    send_everywhere(mesh, after, 3)
    wait_landed(mesh, after, 3 * len(EXPECTED_ROUTE))
    assert int(beeline(mesh, "SELECT count(*) FROM logjam.messages")[0][0]) == count + 3 * len(EXPECTED_ROUTE)


def test_the_real_otlp_and_syslog_clients_land_in_the_table(mesh, tmp_path):
    """Issue 36 through the mesh `make up` runs, into the table: the OpenTelemetry SDK's gRPC and
    HTTP exporters, the npm OTLP/JSON exporter, rsyslog forwarding with omrelp, and `logger` over
    octet-counted TCP; every record is acknowledged and lands once with the documented fields."""
    import shutil

    from opentelemetry.sdk._logs.export import LogRecordExportResult

    from tests.otlp_clients import grpc_exporter, http_exporter, sdk_records
    from tests.test_syslog_interop import OMRELP, RSYSLOGD, daemon, relp_action, rsyslog, send_lines
    from harness.processes import free_port

    run, n = f"ship-{uuid.uuid4().hex[:10]}", 5
    resource = {"service.name": "shop", "deployment.environment.name": "interop"}
    for name, exporter in (("grpc", grpc_exporter(mesh.port("LOGJAM_OTLP_GRPC_PORT"))),
                           ("http", http_exporter(mesh.port("LOGJAM_OTLP_HTTP_PORT"), gzip=True))):
        try:
            assert exporter.export(sdk_records(resource, n, f"{run} sdk-{name}")) == LogRecordExportResult.SUCCESS
        finally:
            exporter.shutdown()
    node = shutil.which("node")
    assert node, "node is needed for the npm OTLP/JSON exporter"
    out = subprocess.run([node, "send_otlp_json.js", f"http://127.0.0.1:{mesh.port('LOGJAM_OTLP_HTTP_PORT')}/v1/logs",
                          str(n), f"{run} npm", "shop", "interop", "none"], cwd=Path(__file__).parent / "node",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for i in range(n):
        res = subprocess.run(["logger", "--tcp", "--octet-count", "--rfc5424", "-n", "127.0.0.1",
                              "-P", str(mesh.port("LOGJAM_SYSLOG_PORT")), "-t", "interop", f"{run} logger {i}"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
    assert RSYSLOGD, "rsyslog is needed (make syslog-clients)"
    port = free_port()
    with daemon(rsyslog(tmp_path, port, relp_action(mesh.port("LOGJAM_RELP_PORT")), modules=OMRELP), port):
        send_lines(port, f"{run} rsyslog", n)
        rows = wait_landed(mesh, run, 5 * n)
    kinds: dict[str, list[dict]] = {}
    for row in rows:
        body = orjson.loads(row["body"])
        words = body["message"].split()
        kinds.setdefault(words[words.index(run) + 1], []).append((row, body))
    assert {k: len(v) for k, v in kinds.items()} == {"sdk-grpc": n, "sdk-http": n, "npm": n, "logger": n, "rsyslog": n}
    for kind in ("sdk-grpc", "sdk-http", "npm"):
        for row, body in kinds[kind]:
            assert (row["app_env"], row["topic"]) == ("shop-interop", "logs.otlp"), row
            assert body["resource"]["attributes"]["service.name"] == "shop" and body["@metadata"]["protocol"] == "otlp"
            assert row["event_id"] == body["@metadata"]["_id"]
    for kind in ("logger", "rsyslog"):
        for row, body in kinds[kind]:
            assert (row["app_env"], row["topic"]) == ("syslog-default", "logs.syslog"), row
            assert body["syslog"]["app_name"] == "interop" and body["@metadata"]["protocol"] == "syslog"
    assert len({row["event_id"] for row, _ in sum(kinds.values(), [])}) == 5 * n
