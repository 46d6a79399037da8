"""A whole mesh under the real supervisord on spare ports.

`mesh_ports`: free ports for every LOGJAM_*_PORT (also of tests/mesh_support.py's mesh). `Mesh`: the
mesh as `make up` runs it, with a Spark Connect session on it, for benchmarks/e2e.py, the benchmarks
built on it and tests/test_mesh_fairness.py; `cpu`: the CPU seconds of its programs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.processes import REPO, command, free_port, free_port_run, port_open, wait_for
from tools.mesh import DEFAULTS, DEVICE_PORTS, ensure_keys, mesh_environment

CLK_TCK = os.sysconf("SC_CLK_TCK")


# Device K of a test mesh listens this far above device 0 (LOGJAM_DEVICE_PORT_STEP).
PORT_STEP = 7


def mesh_ports(devices: int, importers: int) -> dict[str, str]:
    """Free test ports for every LOGJAM_*_PORT, with room for `devices` devices and `importers` importers."""
    ports = {k: str(free_port()) for k in DEFAULTS if k.endswith("_PORT") and k not in DEVICE_PORTS}
    ports.update({k: str(free_port_run(devices, PORT_STEP)) for k in DEVICE_PORTS})
    # Importer I serves LOGJAM_IMPORTER_METRICS_PORT + I: the next ports must be free too.
    ports["LOGJAM_IMPORTER_METRICS_PORT"] = str(free_port_run(importers, 1))
    return ports


def plaintext_config() -> Path:
    """supervisord.conf with CURVE off on every ZeroMQ socket (beside it: paths are relative to %(here)s)."""
    lines = []
    for line in (REPO / "supervisord.conf").read_text().splitlines():
        if line.startswith("command=") and "/logjam-device " in line:
            line += " --allow-plaintext"
        elif line.startswith("command=") and ("/logjam-bridge " in line or "/logjam-importer " in line):
            line += " --plaintext"
        lines.append(line)
    path = REPO / f".e2e-plaintext-{os.getpid()}.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


class Mesh:
    def __init__(self, data: Path, devices: int, importers: int, curve: bool = True,
                 config: Path | None = None) -> None:
        """`config`: a supervisord.conf to run instead of the repository's (benchmarks/chaos.py adds a flag)."""
        env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
        env.update(mesh_ports(devices, importers))
        env.update(LOGJAM_DATA_DIR=str(data), LOGJAM_BIND="127.0.0.1", LOGJAM_DEVICES=str(devices),
                   LOGJAM_IMPORTERS=str(importers), LOGJAM_DEVICE_PORT_STEP=str(PORT_STEP))
        self.config = config or (REPO / "supervisord.conf" if curve else plaintext_config())
        self.env = mesh_environment(self.config, env)
        if curve:
            ensure_keys(self.env)
        self.proc = subprocess.Popen([command("supervisord"), "-c", str(self.config), "-n"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from pyspark.sql import SparkSession

        self.url = f"sc://127.0.0.1:{self.env['LOGJAM_SPARK_PORT']}"
        wait_for(lambda: port_open(int(self.env["LOGJAM_SPARK_PORT"])) and self.subscribed(), timeout=300,
                 interval=1, what="the mesh to come up")
        self.spark = SparkSession.builder.remote(self.url).create()

    def subscribed(self) -> bool:
        """Every importer logged that it is subscribed (it has its table and its resume point)."""
        logs = Path(self.env["LOGJAM_DATA_DIR"], "logs")
        paths = [logs / f"logjam-importer-{i}.log" for i in range(int(self.env["LOGJAM_IMPORTERS"]))]
        return all(p.exists() and b" subscribed to " in p.read_bytes() for p in paths)

    def rows(self) -> int:
        return int(self.spark.sql("SELECT count(*) FROM logjam.messages WHERE app_env = 'lumberjack-default'")
                   .collect()[0][0])

    def shares(self) -> dict[int, int]:
        """Importer -> rows it landed."""
        rows = self.spark.sql("SELECT importer, count(*) FROM logjam.messages WHERE app_env = 'lumberjack-default' "
                              "GROUP BY importer").collect()
        return {int(r[0]): int(r[1]) for r in rows}

    def pids(self) -> dict[str, list[int]]:
        out = subprocess.run([command("supervisorctl"), "-c", str(self.config), "status"], env=self.env,
                             capture_output=True, text=True).stdout
        pids = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] == "pid":
                pid = int(parts[3].rstrip(","))
                pids[parts[0]] = [pid, *children(pid)]
        return pids

    def shutdown(self) -> None:
        # Our Connect client first, while its server is up: left open, pyspark's exit hook would
        # call the stopped server and retry for minutes before the process could exit.
        spark, self.spark = getattr(self, "spark", None), None
        if spark is not None:
            try:
                spark.stop()
            except Exception as e:  # a server already gone: nothing to release
                print(f"closing the Spark session: {e}", file=sys.stderr)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def children(pid: int) -> list[int]:
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in children(k)]


def cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for name, group in pids.items():
        total = 0.0
        for pid in group:
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / CLK_TCK
            except OSError:
                pass
        out[name] = total
    return out
