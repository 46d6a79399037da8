"""The run's shared mesh (registered by tests/conftest.py's `pytest_plugins`): one `make up` mesh
(harness.mesh.Mesh: 2 devices, 2 importers, the seven bridges, Spark) for every test that takes
`shared_mesh`, instead of one boot (20-30 s) per module.

- Tests that only send, read and inspect take `shared_mesh` and keep to their own run id or
  app-env, as the mesh holds every earlier test's rows.
- Tests that kill, stop or restart its processes are marked `disturbs_mesh`; they run after the
  others and must leave every program running again. After each of them the fixture checks that
  (every program RUNNING, every /healthz healthy, a probe through every device and importer lands),
  after any other test the first two.
- A test that leaves the mesh broken errors in its teardown, named; every later test that takes
  `shared_mesh` then fails at once naming it, instead of failing for reasons of its own.
- Tests with a mesh of their own (another topology, a cluster, a benchmark that counts whole
  streams) run after all of these, and the shared mesh stops after its last test, so they do not
  share the machine with it.

Under pytest-xdist (`make test`'s `-n 3 --dist loadgroup --no-loadscope-reorder`; any other --dist is refused),
every test that takes the mesh and every test module marked `xdist_group(MESH_GROUP)` (a mesh or
cluster of its own) form one group (harness/xdist_groups.py), run by one worker in the order above:
the shared mesh boots once, and no two meshes run at once.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from harness.mesh import Mesh
from harness.processes import wait_for
from tests.mesh_support import probe_every_device, started_mesh
from tools.mesh import health_report

SHARED = "shared_mesh"
DISTURBS = "disturbs_mesh"
MESH_GROUP = "mesh"  # the xdist_group of every test that runs a mesh, shared or its own


class _State:
    """What the hooks and the fixtures share within one run."""

    broken_by: str | None = None  # node id of the test that left the mesh broken
    last_user: str | None = None  # node id of the last test that takes the mesh


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{DISTURBS}: kills, stops or restarts processes of the shared mesh "
                                       "(tests/mesh_conftest_plugin.py); runs after the tests that do not, and "
                                       "must leave it healthy")
    # Any other distribution would hand the mesh's tests to several workers: a mesh each, side by side.
    dist = getattr(config.option, "dist", "no")
    if getattr(config.option, "tx", None) and dist not in ("no", "loadgroup"):
        raise pytest.UsageError(f"--dist {dist}: the mesh tests need --dist loadgroup (tests/mesh_conftest_plugin.py)")


def _rank(item: pytest.Item) -> int:
    """0: takes the shared mesh; 1: takes it and disturbs it; 2: every other test."""
    if SHARED not in getattr(item, "fixturenames", ()):
        return 2
    return 1 if item.get_closest_marker(DISTURBS) else 0


@pytest.hookimpl(tryfirst=True)  # before any plugin reads the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: within each rank the collected order stays.
    items.sort(key=_rank)
    for item in items:
        if SHARED in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(MESH_GROUP))


def pytest_collection_finish(session: pytest.Session) -> None:
    # After every plugin's selection (-k, -m, deselect): the last test that will take the mesh.
    users = [item.nodeid for item in session.items if SHARED in getattr(item, "fixturenames", ())]
    _State.last_user = users[-1] if users else None


def problems(mesh: Mesh) -> list[str]:
    """Why the mesh is not healthy (empty: every program RUNNING and every /healthz healthy)."""
    states = mesh.states()
    found = [line for state, line in states.values() if state != "RUNNING"]
    if len(states) != mesh.programs():
        found.append(f"supervisord runs {len(states)} programs, not {mesh.programs()}: {sorted(states)}")
    if found:
        return found
    healthy, lines = health_report(mesh.env)
    return [] if healthy else [line.strip() for line in lines if " healthy " not in line]


def check_healthy(mesh: Mesh, probe: bool, timeout: float = 120) -> None:
    """Healthy within `timeout` (a restarted program may still be coming up); with `probe`, it imports too."""
    seen: list[str] = []

    def ok() -> bool:
        seen[:] = problems(mesh)
        return not seen

    try:
        wait_for(ok, timeout=timeout, interval=1, what="every program RUNNING and healthy")
    except AssertionError:
        raise AssertionError("\n".join(seen)) from None
    if probe:
        probe_every_device(mesh, f"healthy-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="session")
def _shared_mesh_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with started_mesh(tmp_path_factory.mktemp("shared-mesh") / "data") as mesh:
        # `python -m tools.mesh up` announces the mesh once it is up (its tests read the banner).
        def announced() -> bool:
            text = mesh.output()
            assert "mesh not fully up" not in text, text
            return "logjam-mesh is up" in text

        wait_for(announced, timeout=120, interval=1, what="python -m tools.mesh up to announce the mesh")
        yield mesh


@pytest.fixture
def shared_mesh(request: pytest.FixtureRequest, _shared_mesh_run: Mesh) -> Iterator[Mesh]:
    """The run's mesh; after the test, checked healthy (see the module's docstring)."""
    mesh = _shared_mesh_run
    if _State.broken_by:
        pytest.fail(f"the shared mesh was left broken by {_State.broken_by}")
    assert mesh.proc is not None, "the shared mesh was stopped after what was to be its last test"
    yield mesh
    try:
        check_healthy(mesh, probe=request.node.get_closest_marker(DISTURBS) is not None)
    except Exception as e:
        _State.broken_by = request.node.nodeid
        raise AssertionError(f"{request.node.nodeid} left the shared mesh broken: {e}\n{mesh.logs()}") from None
    finally:
        if request.node.nodeid == _State.last_user:
            mesh.shutdown()  # the tests after it run meshes of their own: not beside this one
