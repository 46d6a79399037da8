"""The cluster path: a standalone Spark master and worker from the installed pyspark, `logjam-spark
--master spark://...` in front of them, and two importers whose rows land exactly once, read by tasks
on the worker's executor (not in the driver), which gets Delta's jars from the driver."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import urllib.request
from pathlib import Path

import orjson
import pytest

from harness.mesh import Mesh
from harness.processes import command, free_port, port_open, stop, wait_for
from tests.mesh_conftest_plugin import MESH_GROUP
from tests.spark_fixture import SparkServer
from tests.test_importer import Importer
from tests.test_importer_recovery import Journaled, send_numbered, wait_landed

# A cluster and a mesh of its own: with the shared mesh's tests in one xdist worker, after them
# (tests/mesh_conftest_plugin.py), so no two of these run at once.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group(MESH_GROUP)]


def spark_class(spark_home: Path, log: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    with open(log, "w") as out:
        return subprocess.Popen([str(spark_home / "bin" / "spark-class"), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def master_state(ui_port: int) -> dict:
    """The master's state from its web UI; {} while the UI is not up or answers with something else."""
    try:
        return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2).read())
    except (OSError, ValueError, http.client.HTTPException):  # refused, reset, cut short, not JSON yet
        return {}


@pytest.mark.timeout(600)
def test_two_importers_through_a_standalone_cluster_land_exactly_once(tmp_path) -> None:
    from pyspark.find_spark_home import _find_spark_home

    home = Path(_find_spark_home())
    port, ui, worker_ui = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen] = []
    work = tmp_path / "work"
    procs.append(spark_class(home, tmp_path / "master.log", "org.apache.spark.deploy.master.Master",
                             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)))
    procs.append(spark_class(home, tmp_path / "worker.log", "org.apache.spark.deploy.worker.Worker",
                             f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
                             "--webui-port", str(worker_ui), "--work-dir", str(work)))
    imps: list[Importer] = []
    j = None
    try:
        wait_for(lambda: master_state(ui).get("aliveworkers", 0) == 1, timeout=120, interval=0.5,
                 what="the standalone worker to register")
        connect = free_port()
        warehouse = tmp_path / "wh"
        log = tmp_path / "logjam-spark.log"
        with open(log, "w") as out:
            server_proc = subprocess.Popen(
                [command("logjam-spark"), "--master", f"spark://127.0.0.1:{port}", "--port", str(connect),
                 "--jdbc-port", "0", "--warehouse", str(warehouse), "--metastore", str(tmp_path / "metastore"),
                 "--driver-memory", "1g", "--conf", "spark.executor.memory=1g"],
                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        procs.append(server_proc)
        server = SparkServer(server_proc, connect, warehouse, log)
        wait_for(lambda: port_open(connect) and "table logjam.messages ready" in server.output(), timeout=180,
                 interval=0.5, what="logjam-spark on the cluster")
        assert "instead" not in server.output(), "the driver must bind --bind, not guess an address"

        j = Journaled(tmp_path / "dev")
        for i in range(2):
            imp = Importer(j.dev, "--flush-interval", "0.5", "--replay-port", str(j.replay_port),
                           "--worker", str(i), "--workers", "2", warehouse=warehouse, state_dir=tmp_path / "state")
            imps.append(imp)
        for imp in imps:
            imp.wait_ready(j.dev)
        streams = ["cluster-a", "cluster-b", "cluster-c", "cluster-d"]
        for k, app_env in enumerate(streams):
            send_numbered(j.dev, app_env, range(k * 1000, k * 1000 + 300))
        for k, app_env in enumerate(streams):
            wait_landed(warehouse, app_env, 300, timeout=180)
            # Read back through the cluster: the query's tasks run on the worker's executor.
            rows = server.session().sql(f"SELECT seq, body FROM logjam.messages WHERE app_env = '{app_env}'").collect()
            ns = sorted(orjson.loads(r.body)["n"] for r in rows)
            assert ns == list(range(k * 1000, k * 1000 + 300)) and len({r.seq for r in rows}) == len(rows) == 300
        assert {imp.metric("logjam_importer_rows_written_total") > 0 for imp in imps} == {True}, \
            "both workers wrote their share"
        # The queries that read them ran as tasks on the worker's executor (Delta's jars shipped to it).
        logs = list(work.glob("app-*/*/stderr"))
        assert logs, f"no executor ran on the worker: {list(work.rglob('*'))[:20]}"
        assert any("Finished task" in p.read_text(errors="replace") for p in logs)
        assert master_state(ui)["activeapps"][0]["name"] == "logjam Spark server"
    finally:
        for imp in imps:
            imp.stop()
        if j is not None:
            j.close()
        for p in reversed(procs):
            stop(p, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_devices_two_importers_on_two_workers_survive_a_device_sigkill(tmp_path, tmp_path_factory) -> None:
    """The scale-out topology on a cluster: the whole mesh (2 devices, 2 importers owning one each)
    under supervisord with `logjam-spark --master spark://...` in front of a standalone master and two
    workers. Under load (DEALER to device 0, pylogbeat through the bridge to both devices) device 0 is
    SIGKILLed; every acknowledged event lands exactly once, and tasks ran on both workers."""
    from pyspark.find_spark_home import _find_spark_home

    from tests.mesh_support import started_mesh

    home = Path(_find_spark_home())
    port, ui = free_port(), free_port()
    procs = [spark_class(home, tmp_path / "master.log", "org.apache.spark.deploy.master.Master",
                         "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui))]
    works = [tmp_path / f"work-{w}" for w in range(2)]
    for w, work in enumerate(works):
        procs.append(spark_class(home, tmp_path / f"worker-{w}.log", "org.apache.spark.deploy.worker.Worker",
                                 f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                 "--webui-port", str(free_port()), "--work-dir", str(work)))
    try:
        wait_for(lambda: master_state(ui).get("aliveworkers", 0) == 2, timeout=180, interval=0.5,
                 what="both standalone workers to register")
        # The first writes wait for both executors to start (a minute or more on a busy 2-core host).
        with started_mesh(tmp_path_factory.mktemp("mesh") / "data", ready_timeout=600, devices=2, importers=2,
                          extra={"LOGJAM_SPARK_MASTER": f"spark://127.0.0.1:{port}"}) as mesh:
            run_cluster_fault(mesh, ui, works)
    finally:
        for p in reversed(procs):
            stop(p, timeout=60)


def run_cluster_fault(mesh: Mesh, ui: int, works: list[Path]) -> None:
    """Device 0 SIGKILLed under load on the cluster mesh; what landed, and where its tasks ran."""
    from tests.test_mesh_faults import device_sigkill_keeps_every_acked_event

    dealer, beats = device_sigkill_keeps_every_acked_event(mesh, "cluster")
    # Every row came through one of the mesh's two devices (the table has no importer column: which
    # importer landed a row is its device's owner). The bridge's one pylogbeat connection has a home
    # device, whichever answered first with the fewest connections, so which devices carried it
    # depends on the start; the Producer's rows are device 0's.
    devices = {mesh.device_id(0), mesh.device_id(1)}
    for run_id in (beats.run_id, dealer.run_id):
        rows = mesh.sql(f"SELECT device, count(*) AS n FROM messages WHERE body LIKE '%{run_id}%' GROUP BY 1")
        assert rows and {r["device"] for r in rows} <= devices, rows
    # Queries ran as tasks on both workers' executors (with Delta's jars, shipped by spark.jars), for the
    # mesh's Spark server.
    assert master_state(ui)["activeapps"][0]["name"] == "logjam Spark server"
    for work in works:
        logs = list(work.glob("app-*/*/stderr"))
        assert logs and any("Finished task" in p.read_text(errors="replace") for p in logs), \
            f"no task finished on the executor under {work}"
