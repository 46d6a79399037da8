"""Scale-out through `python -m tools.mesh up` (what `make up` runs): several devices, importers that
own devices, and progress that belongs to the device.

- Events acknowledged while the mesh starts, before any importer has subscribed (they
  subscribe 10-20 s after `up`, once Spark answers), land exactly once: an importer that
  finds no rows for a device reads its journal from the oldest seq it holds.
- Restarting with other LOGJAM_DEVICES / LOGJAM_IMPORTERS (2x2, then 2 devices and 1
  importer, then 3x3) loses and duplicates nothing: an importer taking over a device resumes
  after the last row any importer wrote for it, and a new device is read from its start.

Every phase sends before the importers subscribe: to every device's ROUTER (Logjam
Producer, each 202 an acknowledgement) and through the Lumberjack bridge (pylogbeat, each
window acknowledged), which sends a connection's windows to its home device.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from pylogbeat import PyLogBeatClient

from logjam.curve import ClientKey
from logjam.producer import Producer
from harness.processes import REPO, port_open, wait_for
from harness.mesh import PORT_STEP, mesh_ports
from tests.mesh_support import Mesh
from tools.mesh import DEFAULTS, ensure_keys, mesh_environment

pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow]

PER_DEVICE = 300  # Producer events per device and phase
BEATS = 300  # pylogbeat events per phase, in windows of 50


class UpMesh:
    """`python -m tools.mesh up` on test ports over one data dir; ports stay the same across restarts."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.ports = mesh_ports(4, 4)
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.devices = 0

    def up(self, devices: int, importers: int) -> None:
        env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
        env.update(self.ports)
        env.update(LOGJAM_DATA_DIR=str(self.data), LOGJAM_BIND="127.0.0.1", LOGJAM_DEVICES=str(devices),
                   LOGJAM_IMPORTERS=str(importers), LOGJAM_DEVICE_PORT_STEP=str(PORT_STEP),
                   LOGJAM_SPARK_MASTER="local[2]")
        self.env = mesh_environment(REPO / "supervisord.conf", env)
        self.devices = devices
        self.importers = importers
        self.out = self.data / f"mesh-up-{devices}x{importers}.out"
        self.offsets = {p: p.stat().st_size for p in (self.data / "logs").glob("logjam-importer-*.log")}
        with open(self.out, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "tools.mesh", "up"], cwd=REPO, env=self.env,
                                         stdout=f, stderr=subprocess.STDOUT)

    def mesh(self) -> Mesh:
        """A Mesh view (ports, sql) of what runs now; it starts nothing."""
        m = Mesh.__new__(Mesh)
        m.env, m.devices, m.importers, m.config = self.env, self.devices, self.importers, REPO / "supervisord.conf"
        # The keys `make up` makes before it starts anything (ensure_keys is idempotent).
        m.key = ClientKey.from_dir(ensure_keys(self.env))
        return m

    def subscribed(self) -> int:
        """How many importers have logged "subscribed to" since this phase's `up`."""
        n = 0
        for path in (self.data / "logs").glob("logjam-importer-*.log"):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                n += b" subscribed to " in f.read()
        return n

    def wait_announced(self) -> None:
        def announced() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.out.read_text()
            text = self.out.read_text()
            assert "mesh not fully up" not in text, text + self.logs()
            return "logjam-mesh is up" in text

        wait_for(announced, timeout=400, interval=1, what="python -m tools.mesh up to announce the mesh")

    def down(self) -> None:
        if self.proc is None:
            return
        subprocess.run([sys.executable, "-m", "tools.mesh", "down"], cwd=REPO, env=self.env, capture_output=True,
                       timeout=120)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n" + p.read_text(errors="replace")[-3000:]
                         for p in sorted((self.data / "logs").glob("*.log")))


def send_while_starting(um: UpMesh, run: str) -> set[str]:
    """As soon as the devices and the bridge listen, send and collect the acknowledged markers."""
    m = um.mesh()
    ports = [m.port("LOGJAM_ROUTER_PORT", k) for k in range(um.devices)] + [m.port("LOGJAM_LUMBERJACK_PORT")]
    wait_for(lambda: all(port_open(p) for p in ports), timeout=120, interval=0.1, what="devices and bridge listening")
    acked: set[str] = set()
    for k in range(um.devices):
        with Producer(f"tcp://127.0.0.1:{m.port('LOGJAM_ROUTER_PORT', k)}", curve=m.key) as p:
            lines = [f"{run} dealer d{k} {i}" for i in range(PER_DEVICE)]
            for line in lines:
                p.submit("scale-a", "logs.scale", {"message": line})
            assert p.flush().accepted == PER_DEVICE
            acked.update(lines)
    client = PyLogBeatClient("127.0.0.1", m.port("LOGJAM_LUMBERJACK_PORT"), ssl_enable=False, use_logging=False)
    client.connect()
    for w in range(BEATS // 50):
        lines = [f"{run} beats {w * 50 + i}" for i in range(50)]
        client.send([{"message": line} for line in lines])  # returns once the window is acknowledged
        acked.update(lines)
    client.close()
    return acked


def landed_counts(um: UpMesh, runs: list[str]) -> collections.Counter:
    where = " OR ".join(f"body LIKE '%{r}%'" for r in runs)
    rows = um.mesh().sql(f"SELECT body FROM messages WHERE {where}")
    return collections.Counter(orjson.loads(r["body"])["message"] for r in rows)


def check_exactly_once(um: UpMesh, runs: list[str], acked: set[str]) -> None:
    counts: collections.Counter = collections.Counter()

    def all_landed() -> bool:
        counts.clear()
        counts.update(landed_counts(um, runs))
        return acked <= set(counts)

    try:
        wait_for(all_landed, timeout=300, interval=3, what="every acknowledged event in Spark")
    except AssertionError:
        missing = sorted(acked - set(counts))
        raise AssertionError(f"{len(missing)} of {len(acked)} acknowledged events never landed, e.g. "
                             f"{missing[:5]}\n{um.logs()}") from None
    twice = {m: n for m, n in counts.items() if n != 1}
    assert not twice, f"landed more than once: {sorted(twice.items())[:10]}"
    assert set(counts) == acked, f"strays: {sorted(set(counts) - acked)[:5]}"


@pytest.fixture
def upmesh(tmp_path: Path):
    um = UpMesh(tmp_path / "data")
    try:
        yield um
    finally:
        um.down()


def check_each_importer_landed_its_device(um: UpMesh, run: str) -> None:
    rows = um.mesh().sql(f"SELECT importer, device, count(*) AS n FROM messages WHERE body LIKE '%{run} dealer%' "
                         "GROUP BY 1, 2")
    first = int(um.env["LOGJAM_DEVICE_ID"])
    assert {(r["importer"], r["device"], r["n"]) for r in rows} == {(0, first, PER_DEVICE), (1, first + 1, PER_DEVICE)}


def test_events_acked_before_the_importers_subscribe_and_across_resizes_land_exactly_once(upmesh: UpMesh) -> None:
    """One mesh data dir through 2x2, 2x1 and 3x3. Each phase sends while the mesh starts; the
    first phase also proves that its events were acknowledged before any importer subscribed,
    and that each importer landed the device it owns. (One test, not two: each `up` costs a
    Spark start, 30-40 s.)"""
    runs: list[str] = []
    acked: set[str] = set()
    for devices, importers in ((2, 2), (2, 1), (3, 3)):
        run = f"re{devices}x{importers}-{uuid.uuid4().hex[:8]}"
        runs.append(run)
        upmesh.up(devices, importers)
        sent = send_while_starting(upmesh, run)
        if not acked:
            assert upmesh.subscribed() == 0, "the importers subscribed before the events were acknowledged: nothing tested"
            assert len(sent) == 2 * PER_DEVICE + BEATS
        acked |= sent
        upmesh.wait_announced()
        check_exactly_once(upmesh, runs, acked)
        if len(runs) == 1:
            check_each_importer_landed_its_device(upmesh, run)
        upmesh.down()
