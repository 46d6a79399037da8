"""The whole mesh under the real supervisord, on test ports, end to end.

Events go in through all four bridges (pylogbeat, the real Beats-protocol client, for
Lumberjack; `logjam-send` for the others) and straight to the device over DEALER and
PUSH. `logjam-sql` must then show every event exactly once with the right app_env,
topic and @metadata. Then one importer is SIGKILLed: supervisord must restart it, and
traffic sent afterwards must land.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import orjson
import pytest

from tests.helpers import wait_for
from tests.mesh_support import EXPECTED_ROUTE, landed, running_mesh, send_everywhere, wait_landed, wait_until_importing

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    yield from running_mesh(tmp_path_factory)


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
        assert row["device"] == int(mesh.env["LOGJAM_DEVICE_ID"])
        if protocol:
            assert body["@metadata"]["protocol"] == protocol
            assert body["@metadata"]["peer"].startswith("127.0.0.1:")
    assert set(seen) == set(expected)
    # Both importers wrote: mesh-a and mesh-b hash (CRC32) to worker 1, the bridges' defaults to 0.
    roots = sorted(p.name for p in Path(mesh.env["LOGJAM_DATA_DIR"], "warehouse", "messages").glob("importer=*"))
    assert roots == ["importer=0", "importer=1"]


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
