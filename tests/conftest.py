"""Shared fixtures: a real logjam-device process on random ports, each test under LOGJAM_NATIVE=require
and off where the C path decides its outcome (`native_mode`), test certificates, the session's
logjam-spark (tests/spark_fixture.py) and the shared mesh (tests/mesh_conftest_plugin.py)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.device import DeviceProcess, start_device
from harness.processes import stop
from tests.spark_fixture import spark_server  # noqa: F401  (session-scoped logjam-spark, shared by every Spark test)

# The run's shared mesh (`shared_mesh`) and the mesh tests' order; `--dist loadgroup`'s groups under pytest-xdist.
pytest_plugins = ["tests.mesh_conftest_plugin", "harness.xdist_groups"]

# Every JVM the tests start (logjam-spark, the mesh's, a standalone cluster's, beeline) compiles
# with C1 only. A test's JVM lives seconds to minutes, and on two shared cores C2's compiler
# threads were the largest CPU cost of a Spark test (measured: one crash-point test's process tree
# 65-80 s of CPU with C2, 35-43 s with C1 only). Benchmarks and `make up` keep the JVM's default.
# A JVM notes the variable on stderr ("Picked up JAVA_TOOL_OPTIONS"); no test reads a JVM's stderr.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

# LOGJAM_NATIVE (logjam/native.py) per test, where the C path and its Python twin both need
# running: `require` (the C, or a failure when it is not built) and `off` (the twin), in one
# pytest run. Tests whose outcome cannot depend on the switch run once, under the LOGJAM_NATIVE
# they inherit (CI: require).
NATIVE_MODES = [pytest.param("require", id="C"), pytest.param("off", id="py")]


# Markers derived from the fixtures a test uses (its fixtures' own fixtures included), so that
# `-m spark` and `-m 'not slow'` select what they say: a fixture that starts a Spark JVM
# (logjam-spark alone, or a whole mesh with its own) makes a test `spark`; a whole mesh, `slow`.
# A test that starts Spark or a mesh in its body carries the mark itself (test_spark_cluster.py).
SPARK_FIXTURES = frozenset({"spark_server", "jdbc_server", "shared_mesh", "upmesh"})
MESH_FIXTURES = frozenset({"shared_mesh", "upmesh"})


@pytest.hookimpl(tryfirst=True)  # before harness/xdist_groups.py orders the groups by this mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)
        if used & MESH_FIXTURES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=NATIVE_MODES)
def native_mode(request, monkeypatch) -> str:
    """LOGJAM_NATIVE for this test, once `require` and once `off`: for this process (every
    native.load reads the switch anew) and for every process it starts (harness.processes.start
    copies os.environ), so a fixture that starts one should ask for this first."""
    monkeypatch.setenv("LOGJAM_NATIVE", request.param)
    return request.param


@contextmanager
def native_env(mode: str):
    """LOGJAM_NATIVE=`mode` within the block: for a Hypothesis test (which takes no function-scoped
    fixture such as `native_mode`), or a module-scoped fixture."""
    old = os.environ.get("LOGJAM_NATIVE")
    os.environ["LOGJAM_NATIVE"] = mode
    try:
        yield mode
    finally:
        if old is None:
            del os.environ["LOGJAM_NATIVE"]
        else:
            os.environ["LOGJAM_NATIVE"] = old


@pytest.fixture
def device():
    """A running logjam-device with device id 1; stopped (and checked for exit 0) afterwards."""
    dev = start_device()
    yield dev
    assert stop(dev.proc) == 0, dev.output()


@pytest.fixture
def native_device(native_mode):
    """A device on each loop (require, off); `native_mode` gives every bridge the test starts the same.
    For the tests whose events go through a bridge's device link; the rest take `device`."""
    dev = start_device(native=native_mode)
    yield dev
    assert stop(dev.proc) == 0, dev.output()


@pytest.fixture
def device_factory():
    """Start devices with custom flags: `device_factory(device_id=3, extra=[...])`."""
    started: list[DeviceProcess] = []

    def make(**kwargs) -> DeviceProcess:
        dev = start_device(**kwargs)
        started.append(dev)
        return dev

    yield make
    for dev in started:
        stop(dev.proc)


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> "TestCerts":
    from tests.tls_certs import make_certs

    return make_certs(Path(tmp_path_factory.mktemp("certs")))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Close the Spark Connect clients the tests left open, without calling their servers.

    pyspark's exit hook asks the server of every open client to clean its ML cache, and a
    server that a test already stopped is retried with backoff for many minutes before the
    process may exit (measured: a finished run of test_mesh_fairness hung 13 minutes).
    """
    import gc
    import sys

    core = sys.modules.get("pyspark.sql.connect.client.core")
    if core is None:
        return
    for obj in gc.get_objects():
        if isinstance(obj, core.SparkConnectClient) and not obj.is_closed:
            try:
                obj.close()
            except Exception:  # a channel already broken: closed is all we want
                obj._closed = True


@pytest.fixture(autouse=True)
def _no_inherited_connect_session() -> None:
    """Each test starts without the Connect session an earlier test of this worker left active.

    pyspark keeps a thread's first Connect session as the active one and asks it for a setting
    the first time a DataFrame is given a column name; when that earlier test's server has been
    stopped since, the call retries until the test's timeout."""
    import sys

    module = sys.modules.get("pyspark.sql.connect.session")
    if module is None:
        return
    session = module.SparkSession
    session._active_session.session = None
    session._default_session = None
