"""A whole mesh as `make up` runs it (`python -m tools.mesh up`: supervisord and every program), on
spare ports and a data dir of the caller's; nothing is written into the repository.

The one way tests and benchmarks run a mesh. `Mesh`: start it, wait until it imports, drive and query
it (supervisorctl, ports, `logjam-sql`, a Spark Connect session), stop it; `mesh_ports`: free ports for
every LOGJAM_*_PORT; `cpu`: the CPU seconds of its programs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from harness.cpu import children
from harness.processes import REPO, command, free_port, free_port_run, port_open, stop, wait_for
from logjam.curve import ClientKey
from tools.mesh import (DEFAULTS, DEVICE_PORTS, device_port, ensure_keys, importers_subscribed, log_offsets,
                        mesh_environment, spark_table_ready)

# Device K of a test mesh listens this far above device 0 (LOGJAM_DEVICE_PORT_STEP).
PORT_STEP = 7
# supervisord.conf's programs besides the devices and importers: logjam-spark, device 0 (its
# [program:logjam-device]) and the seven bridges; device K > 0 and importer I are one program each.
FIXED_PROGRAMS = 8


def mesh_ports(devices: int, importers: int) -> dict[str, str]:
    """Free test ports for every LOGJAM_*_PORT, with room for `devices` devices and `importers` importers."""
    ports = {k: str(free_port()) for k in DEFAULTS if k.endswith("_PORT") and k not in DEVICE_PORTS}
    ports.update({k: str(free_port_run(devices, PORT_STEP)) for k in DEVICE_PORTS})
    # Importer I serves LOGJAM_IMPORTER_METRICS_PORT + I: the next ports must be free too.
    ports["LOGJAM_IMPORTER_METRICS_PORT"] = str(free_port_run(importers, 1))
    return ports


def plaintext_config(dest: Path) -> Path:
    """supervisord.conf with CURVE off on every ZeroMQ socket, written into `dest` (its %(here)s
    paths made the repository's, as the copy does not live beside the original)."""
    lines = []
    for line in (REPO / "supervisord.conf").read_text().replace("%(here)s", str(REPO)).splitlines():
        if line.startswith("command=") and "/logjam-device " in line:
            line += " --allow-plaintext"
        elif line.startswith("command=") and ("/logjam-bridge " in line or "/logjam-importer " in line):
            line += " --plaintext"
        lines.append(line)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "supervisord-plaintext.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


class Mesh:
    """`python -m tools.mesh up` over `data` on free ports, `devices` devices and `importers` importers.

    By default the constructor starts it, waits until every program runs, every importer has
    subscribed and Spark answers (`ready_timeout`), and opens a Spark Connect session (`spark`,
    `session=False`: none). With `start=False` it only picks the ports; `up` starts each run
    (another topology over the same data dir and ports), `down` stops it.
    """

    def __init__(self, data: Path, devices: int = 2, importers: int = 2, curve: bool = True,
                 config: Path | None = None, extra: dict[str, str] | None = None, *,
                 ports: dict[str, str] | None = None, start: bool = True, session: bool = True,
                 ready_timeout: float = 300) -> None:
        """`config`: a supervisord.conf to run instead of the repository's (benchmarks/chaos.py adds a
        flag); `extra`: LOGJAM_* settings over the defaults (LOGJAM_SPARK_MASTER, say); `ports`: what
        `mesh_ports` gave, when later runs need room for more devices or importers than the first."""
        self.data = Path(data).resolve()  # the variant config may live in it: no path relative to that
        self.curve = curve
        self.extra = dict(extra or {})
        self.ports = ports or mesh_ports(devices, importers)
        self.config = config or (REPO / "supervisord.conf" if curve else plaintext_config(self.data))
        self.devices, self.importers = devices, importers
        self.proc: subprocess.Popen | None = None
        self.spark = None
        self.key: ClientKey | None = None
        self.offsets: dict[Path, int] = {}
        self.env = self._environment(devices, importers)
        if not start:
            return
        self.up(devices, importers)
        try:
            self.wait_up(ready_timeout)
        except BaseException:
            self.down()  # the caller gets no Mesh to shut down
            raise
        if session:
            from pyspark.sql import SparkSession

            self.spark = SparkSession.builder.remote(self.url).create()

    def _environment(self, devices: int, importers: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
        env.update(self.ports)
        env.update(LOGJAM_DATA_DIR=str(self.data), LOGJAM_BIND="127.0.0.1", LOGJAM_DEVICES=str(devices),
                   LOGJAM_IMPORTERS=str(importers), LOGJAM_DEVICE_PORT_STEP=str(PORT_STEP))
        env.update(self.extra)
        return mesh_environment(self.config, env)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.env['LOGJAM_SPARK_PORT']}"

    @property
    def out(self) -> Path:
        """What `python -m tools.mesh up` printed in this run (its banner once the mesh is up)."""
        return self.data / f"mesh-up-{self.devices}x{self.importers}.out"

    def up(self, devices: int, importers: int) -> None:
        """Start `python -m tools.mesh up` with this topology; returns at once (see `wait_up`)."""
        assert self.proc is None, "the mesh is running: down() first"
        self.devices, self.importers = devices, importers
        self.env = self._environment(devices, importers)
        if self.curve:
            # As `make up` does before supervisord starts anything; clients connect with the client key.
            self.key = ClientKey.from_dir(ensure_keys(self.env))
        # Where each importer's log and logjam-spark's end now: "subscribed" and "ready" count from here
        # (a data dir may be reused).
        self.offsets = log_offsets(self.env)
        with open(self.out, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "tools.mesh", "up", "--config", str(self.config)],
                                         cwd=REPO, env=self.env, stdout=f, stderr=subprocess.STDOUT)

    def programs(self) -> int:
        """How many programs supervisord runs for this topology."""
        return FIXED_PROGRAMS + self.devices + self.importers

    def ready(self) -> bool:
        """Every program RUNNING, every importer subscribed since `up`, Spark Connect listening and the table
        named in its catalog since `up`."""
        assert self.proc is not None and self.proc.poll() is None, \
            f"python -m tools.mesh up exited ({self.proc and self.proc.returncode}):\n{self.output()}\n{self.logs()}"
        states = self.states()
        return (len(states) == self.programs() and all(s == "RUNNING" for s, _ in states.values())
                and importers_subscribed(self.env, self.offsets) and port_open(self.port("LOGJAM_SPARK_PORT"))
                and spark_table_ready(self.env, self.offsets))

    def wait_up(self, timeout: float = 300) -> None:
        try:
            wait_for(self.ready, timeout=timeout, interval=1, what="the mesh to come up")
        except AssertionError as e:
            raise AssertionError(f"mesh not up: {e}\n{self.states()}\n{self.logs()}") from None

    def output(self) -> str:
        try:
            return self.out.read_text(errors="replace")
        except OSError:
            return ""

    def port(self, key: str, device: int = 0) -> int:
        """The port of `key`; for a per-device port (tools.mesh.DEVICE_PORTS), device `device`'s."""
        return device_port(self.env, key, device) if key in DEVICE_PORTS else int(self.env[key])

    def device_id(self, device: int) -> int:
        return int(self.env["LOGJAM_DEVICE_ID"]) + device

    def ctl(self, *args: str) -> str:
        """supervisorctl's output for `args` (status, pid NAME, restart NAME...)."""
        return subprocess.run([command("supervisorctl"), "-c", str(self.config), *args], env=self.env,
                              capture_output=True, text=True, timeout=60).stdout

    def states(self) -> dict[str, tuple[str, str]]:
        """Program -> (its state, supervisorctl's whole line)."""
        out = {}
        for line in self.ctl("status").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isupper():
                out[parts[0]] = (parts[1], line)
        return out

    def pid(self, name: str) -> int:
        return int(self.ctl("pid", name).strip())

    def pids(self) -> dict[str, list[int]]:
        """Program -> its pid and its descendants' (logjam-spark's JVM is its child)."""
        pids = {}
        for line in self.ctl("status").splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] == "pid":
                pid = int(parts[3].rstrip(","))
                pids[parts[0]] = [pid, *children(pid)]
        return pids

    def sql(self, query: str) -> list[dict]:
        """Rows of `query` through `logjam-sql --json` (a fresh client each call, so a restarted
        server is no matter)."""
        res = subprocess.run(
            [command("logjam-sql"), "--json", "--max-rows", "0", "--spark", self.url,
             "--warehouse", f"{self.env['LOGJAM_DATA_DIR']}/warehouse", query],
            capture_output=True, text=True, timeout=120,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return [orjson.loads(line) for line in res.stdout.splitlines() if line.strip()]

    def rows(self) -> int:
        return int(self.spark.sql("SELECT count(*) FROM logjam.messages WHERE app_env = 'lumberjack-default'")
                   .collect()[0][0])

    def shares(self) -> dict[int, int]:
        """Device -> rows of the Lumberjack stream it carried (each landed by the importer that owns the device)."""
        rows = self.spark.sql("SELECT device, count(*) FROM logjam.messages WHERE app_env = 'lumberjack-default' "
                              "GROUP BY device").collect()
        return {int(r[0]): int(r[1]) for r in rows}

    def subscribed(self) -> bool:
        """Every importer logged since `up` that it is subscribed (it has its table and its resume point)."""
        return importers_subscribed(self.env, self.offsets)

    def logs(self) -> str:
        """The tail of every log (for a failure's message)."""
        out = []
        for path in sorted(Path(self.env["LOGJAM_DATA_DIR"], "logs").glob("*.log")):
            out.append(f"== {path.name}\n" + path.read_text(errors="replace")[-2000:])
        return "\n".join(out)

    def down(self) -> None:
        """Stop this run: SIGTERM to `tools.mesh up`, which hands it to supervisord and waits for it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            stop(proc, timeout=120)  # (a hang: killed, and an AssertionError once supervisord is stopped)
        finally:
            # A SIGTERM that came before `up` set its handler ended `up` alone: stop its supervisord too.
            stop_supervisord(self.data / "supervisord.pid")

    def shutdown(self) -> None:
        # Our Connect client first, while its server is up: left open, pyspark's exit hook would
        # call the stopped server and retry for minutes before the process could exit.
        spark, self.spark = self.spark, None
        if spark is not None:
            try:
                spark.stop()
            except Exception as e:  # a server already gone: nothing to release
                print(f"closing the Spark session: {e}", file=sys.stderr)
        self.down()


def alive(pid: int) -> bool:
    """`pid` runs (a zombie is no longer running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def is_supervisord(pid: int) -> bool:
    """`pid` is a supervisord (a stale pid file's number may belong to anything by now)."""
    try:
        return b"supervisord" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_supervisord(pidfile: Path, timeout: float = 120) -> None:
    """SIGTERM the supervisord of `pidfile` if it still runs and wait (SIGKILL after `timeout`)."""
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return
    if not alive(pid) or not is_supervisord(pid):
        return
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not alive(pid), timeout=timeout, interval=0.5, what="supervisord to stop")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
