"""Operations on a mesh started the way `make up` starts it (`python -m tools.mesh up`) on
test ports: every process serves Prometheus /metrics and /healthz on its documented
variable's port, `make status` (`python -m tools.mesh status`) shows the verdicts, and a
bridge's /healthz follows its device going away and coming back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from runtime.health import fetch
from tools.mesh import metrics_ports
from harness.processes import REPO, command, wait_for

pytestmark = pytest.mark.timeout(600)

PREFIX = {"logjam-spark": "logjam_table_", "logjam-device": "logjam_device_", "bridge-": "logjam_bridge_",
          "logjam-importer-": "logjam_importer_"}


def mesh_cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.mesh", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def mesh(shared_mesh) -> dict[str, str]:
    """The environment of the run's shared mesh (tests/mesh_conftest_plugin.py), which
    `python -m tools.mesh up` started and announced: what `make up`, `make status` and the tools see."""
    return shared_mesh.env


def ports(env: dict[str, str]) -> dict[str, int]:
    return metrics_ports(env)


def healthz(port: int) -> tuple[int, dict | None]:
    return fetch(f"http://127.0.0.1:{port}/healthz")


def test_every_process_serves_metrics_and_healthz(mesh) -> None:
    for name, port in ports(mesh).items():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        prefix = next(p for k, p in PREFIX.items() if name.startswith(k))
        assert f"\n{prefix}" in text or text.startswith(prefix) or f"# HELP {prefix}" in text, (name, text[:500])
        wait_for(lambda: healthz(port)[0] == 200, timeout=120, interval=0.5, what=f"{name} healthy")
    device = healthz(ports(mesh)["logjam-device"])[1]
    assert device["checks"]["journal"]["ok"] and device["checks"]["publishing"]["ok"]
    bridge = healthz(ports(mesh)["bridge-segment"])[1]
    assert bridge["checks"]["device_link"]["detail"] == f"connected to {mesh['LOGJAM_DEVICE_ROUTERS'].replace(',', ', ')}"
    spark = healthz(ports(mesh)["logjam-spark"])[1]
    assert set(spark["checks"]) == {"jvm", "connect", "jdbc"}


def last_write(port: int) -> float:
    """An importer's logjam_importer_last_write_timestamp_seconds (0 before its first write)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    stamp = [line for line in text.splitlines() if line.startswith("logjam_importer_last_write_timestamp_seconds{")]
    return float(stamp[0].rsplit(" ", 1)[1]) if stamp else 0.0


def test_importer_healthz_reports_its_last_write(mesh) -> None:
    run = uuid.uuid4().hex[:8]
    importers = [p for name, p in ports(mesh).items() if name.startswith("logjam-importer-")]
    # The shared mesh's importers have written before: this test's write is the one after these.
    before = {p: last_write(p) for p in importers}
    res = subprocess.run([command("logjam-send"), "lumberjack", "--to", f"127.0.0.1:{mesh['LOGJAM_LUMBERJACK_PORT']}",
                          *[f"{run} {i}" for i in range(20)]], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # The bridge's window went to one of the two devices, so to the importer that owns it.
    written = lambda: [p for p in importers if "last write" in healthz(p)[1]["checks"]["writes"]["detail"]  # noqa: E731
                       and last_write(p) > before[p]]
    wait_for(written, timeout=120, interval=0.5, what="an importer to commit a batch")
    port = written()[0]
    status, doc = healthz(port)
    assert status == 200 and doc["checks"]["table"]["ok"], doc
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    stamp = [line for line in text.splitlines() if line.startswith("logjam_importer_last_write_timestamp_seconds{")]
    assert stamp and float(stamp[0].rsplit(" ", 1)[1]) > max(before[port], 0)


def health_lines(out: str) -> list[str]:
    """`make status` prints supervisorctl's table, then one /healthz line per process."""
    head, sep, tail = out.partition("/healthz (metrics at the same port's /metrics):")
    assert sep, out
    return tail.strip().splitlines()


@pytest.mark.disturbs_mesh
def test_status_shows_health_and_follows_a_stopped_device(mesh) -> None:
    res = mesh_cli(mesh, "status")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = health_lines(res.stdout)
    assert len(lines) == len(ports(mesh))
    for name, port in ports(mesh).items():
        line = next(line for line in lines if line.strip().startswith(f"{name} "))
        assert f":{port}" in line and " healthy " in line, line

    subprocess.run([command("supervisorctl"), "-c", str(REPO / "supervisord.conf"), "stop", "logjam-device"],
                   env=mesh, capture_output=True, timeout=60, check=True)
    try:
        lumberjack = ports(mesh)["bridge-lumberjack"]
        wait_for(lambda: healthz(lumberjack)[0] == 503, timeout=30, interval=0.5, what="the bridge to see the device go")
        assert healthz(lumberjack)[1]["checks"]["device_link"]["ok"] is False
        res = mesh_cli(mesh, "status")
        assert res.returncode != 0  # supervisorctl says 3 for a stopped program; unhealthy alone is 1
        lines = health_lines(res.stdout)
        assert any(line.strip().startswith("bridge-lumberjack ") and "UNHEALTHY" in line
                   and "device_link FAILING" in line for line in lines), res.stdout
        assert any(line.strip().startswith("logjam-device ") and "no answer" in line for line in lines), res.stdout
    finally:
        subprocess.run([command("supervisorctl"), "-c", str(REPO / "supervisord.conf"), "start", "logjam-device"],
                       env=mesh, capture_output=True, timeout=60)
    wait_for(lambda: mesh_cli(mesh, "status").returncode == 0, timeout=60, interval=1, what="every process healthy again")


def test_curve_guards_tcp_ipc_serves_the_host_and_the_quickstart_tools_need_no_flags(mesh, shared_mesh,
                                                                                      tmp_path: Path) -> None:
    """`make up` made the keys and every device serves this host over ipc (mode 0700 and 0600).
    logjam-send and logjam-tail, with no flag but $LOGJAM_DATA_DIR (as in the quickstart's shell),
    find the mesh: send goes to device 0 over ipc, tail follows every device. Over TCP the
    client key is needed: a client without CURVE and one with keys of another mesh get nothing
    in, and nothing of theirs reaches the table."""
    data = Path(mesh["LOGJAM_DATA_DIR"])
    keys = data / "keys"
    for name in ("server", "client"):
        assert (keys / f"{name}.key_secret").stat().st_mode & 0o777 == 0o600
    for device in ("device", "device-1"):
        ipc = data / device / "ipc"
        assert ipc.stat().st_mode & 0o777 == 0o700 and ipc.stat().st_uid == os.geteuid()
        assert sorted(p.name for p in ipc.iterdir()) == ["pub", "pull", "replay", "router", "stats"]
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in ipc.iterdir())
    banner = shared_mesh.output()
    assert "CURVE           every ZeroMQ TCP port" in banner and "/device[-K]/ipc/<socket> (mode 0700, no CURVE)" in banner
    device = healthz(ports(mesh)["logjam-device"])[1]
    assert device["checks"]["curve"]["detail"].startswith("CURVE on router, pull, pub, stats, replay"), device

    run = uuid.uuid4().hex[:8]
    shown = tmp_path / "tail.out"
    with open(shown, "w") as f:
        tail = subprocess.Popen([command("logjam-tail"), "--app-env", f"quick{run}-", "--json"], env=mesh,
                                stdout=f, stderr=subprocess.STDOUT, text=True)
    device1 = f"127.0.0.1:{int(mesh['LOGJAM_ROUTER_PORT']) + int(mesh['LOGJAM_DEVICE_PORT_STEP'])}"

    def send(app_env: str, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([command("logjam-send"), "logjam", "--app-env", app_env,
                               "--timeout", "3", *flags, f"{run} {app_env}"], env=mesh, capture_output=True,
                              text=True, timeout=60)

    from runtime.curve import ensure

    ensure(tmp_path / "other-mesh")
    assert send(f"quick{run}-plain", "--to", device1, "--plaintext").returncode == 1
    assert send(f"quick{run}-stranger", "--to", device1, "--keys", str(tmp_path / "other-mesh")).returncode == 1
    try:
        # The tail subscribes a moment after it starts: send until it has shown one from each device.
        wait_for(lambda: send(f"quick{run}-ipc").returncode == 0 and send(f"quick{run}-tcp", "--to", device1).returncode == 0
                 and f"quick{run}-ipc" in shown.read_text() and f"quick{run}-tcp" in shown.read_text(),
                 timeout=60, interval=0.5, what="logjam-tail to show what logjam-send sent to both devices")
        assert tail.poll() is None, shown.read_text()
    finally:
        tail.terminate()
        tail.wait(10)

    def rows() -> list[dict]:
        res = subprocess.run([command("logjam-sql"), "--json", "--max-rows", "0", "--spark",
                              f"sc://127.0.0.1:{mesh['LOGJAM_SPARK_PORT']}", "--warehouse",
                              f"{mesh['LOGJAM_DATA_DIR']}/warehouse",
                              f"SELECT app_env, count(*) AS n FROM messages WHERE app_env LIKE 'quick{run}-%' GROUP BY 1"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        return [__import__("json").loads(line) for line in res.stdout.splitlines() if line.strip()]

    landed = wait_for(lambda: r if len(r := rows()) >= 2 else None, timeout=120, interval=2,
                      what="the allowlisted sends to land")
    assert {r["app_env"] for r in landed} == {f"quick{run}-ipc", f"quick{run}-tcp"}, landed
