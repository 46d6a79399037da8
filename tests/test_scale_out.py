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
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest
from pylogbeat import PyLogBeatClient

from logjam.producer import Producer
from harness.mesh import Mesh, mesh_ports
from harness.processes import port_open, wait_for
from tests.mesh_conftest_plugin import MESH_GROUP
from tests.mesh_support import TEST_SETTINGS

# Its own mesh: with the shared mesh's tests in one xdist worker, after them (tests/mesh_conftest_plugin.py).
pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow, pytest.mark.xdist_group(MESH_GROUP)]

PER_DEVICE = 300  # Producer events per device and phase
BEATS = 300  # pylogbeat events per phase, in windows of 50


def subscribed(mesh: Mesh) -> int:
    """How many importers have logged "subscribed to" since this phase's `up`."""
    n = 0
    for path in Path(mesh.env["LOGJAM_DATA_DIR"], "logs").glob("logjam-importer-*.log"):
        with open(path, "rb") as f:
            f.seek(mesh.offsets.get(path, 0))
            n += b" subscribed to " in f.read()
    return n


def wait_announced(mesh: Mesh) -> None:
    """`python -m tools.mesh up` says the mesh is up (every program RUNNING, every importer subscribed)."""
    def announced() -> bool:
        assert mesh.proc is not None and mesh.proc.poll() is None, mesh.output()
        text = mesh.output()
        assert "mesh not fully up" not in text, text + mesh.logs()
        return "logjam-mesh is up" in text

    wait_for(announced, timeout=400, interval=1, what="python -m tools.mesh up to announce the mesh")


def send_while_starting(mesh: Mesh, run: str) -> set[str]:
    """As soon as the devices and the bridge listen, send and collect the acknowledged markers."""
    ports = [mesh.port("LOGJAM_ROUTER_PORT", k) for k in range(mesh.devices)] + [mesh.port("LOGJAM_LUMBERJACK_PORT")]
    wait_for(lambda: all(port_open(p) for p in ports), timeout=120, interval=0.1, what="devices and bridge listening")
    acked: set[str] = set()
    for k in range(mesh.devices):
        with Producer(f"tcp://127.0.0.1:{mesh.port('LOGJAM_ROUTER_PORT', k)}", curve=mesh.key) as p:
            lines = [f"{run} dealer d{k} {i}" for i in range(PER_DEVICE)]
            for line in lines:
                p.submit("scale-a", "logs.scale", {"message": line})
            assert p.flush().accepted == PER_DEVICE
            acked.update(lines)
    client = PyLogBeatClient("127.0.0.1", mesh.port("LOGJAM_LUMBERJACK_PORT"), ssl_enable=False, use_logging=False)
    client.connect()
    for w in range(BEATS // 50):
        lines = [f"{run} beats {w * 50 + i}" for i in range(50)]
        client.send([{"message": line} for line in lines])  # returns once the window is acknowledged
        acked.update(lines)
    client.close()
    return acked


def landed_counts(mesh: Mesh, runs: list[str]) -> collections.Counter:
    where = " OR ".join(f"body LIKE '%{r}%'" for r in runs)
    rows = mesh.sql(f"SELECT body FROM messages WHERE {where}")
    return collections.Counter(orjson.loads(r["body"])["message"] for r in rows)


def check_exactly_once(mesh: Mesh, runs: list[str], acked: set[str]) -> None:
    counts: collections.Counter = collections.Counter()

    def all_landed() -> bool:
        counts.clear()
        counts.update(landed_counts(mesh, runs))
        return acked <= set(counts)

    try:
        wait_for(all_landed, timeout=300, interval=3, what="every acknowledged event in Spark")
    except AssertionError:
        missing = sorted(acked - set(counts))
        raise AssertionError(f"{len(missing)} of {len(acked)} acknowledged events never landed, e.g. "
                             f"{missing[:5]}\n{mesh.logs()}") from None
    twice = {m: n for m, n in counts.items() if n != 1}
    assert not twice, f"landed more than once: {sorted(twice.items())[:10]}"
    assert set(counts) == acked, f"strays: {sorted(set(counts) - acked)[:5]}"


@pytest.fixture
def upmesh(tmp_path: Path):
    """A mesh over one data dir, not started: each phase `up`s it with its topology on the same ports
    (room for 4 devices and 4 importers)."""
    mesh = Mesh(tmp_path / "data", ports=mesh_ports(4, 4), extra=TEST_SETTINGS, start=False, session=False)
    try:
        yield mesh
    finally:
        mesh.shutdown()


def check_each_importer_landed_its_device(mesh: Mesh, run: str) -> None:
    """Each device's events landed once, and each importer (owning one device) committed rows."""
    rows = mesh.sql(f"SELECT device, count(*) AS n FROM messages WHERE body LIKE '%{run} dealer%' GROUP BY 1")
    first = int(mesh.env["LOGJAM_DEVICE_ID"])
    assert {(r["device"], r["n"]) for r in rows} == {(first, PER_DEVICE), (first + 1, PER_DEVICE)}
    for i in range(2):
        port = int(mesh.env["LOGJAM_IMPORTER_METRICS_PORT"]) + i
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        written = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("logjam_importer_rows_written_total"))
        assert written >= PER_DEVICE, f"importer {i} committed {written} rows"


def test_events_acked_before_the_importers_subscribe_and_across_resizes_land_exactly_once(upmesh: Mesh) -> None:
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
            assert subscribed(upmesh) == 0, "the importers subscribed before the events were acknowledged: nothing tested"
            assert len(sent) == 2 * PER_DEVICE + BEATS
        acked |= sent
        wait_announced(upmesh)
        check_exactly_once(upmesh, runs, acked)
        if len(runs) == 1:
            check_each_importer_landed_its_device(upmesh, run)
        upmesh.down()
