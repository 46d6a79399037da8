"""Shared fixtures: a real logjam-device process on random ports, and test certificates."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

from logjam.curve import ClientKey
from logjam.producer import Producer, ReplyTimeout
from tests.helpers import command, free_port, start, stop, wait_for
from tests.spark_fixture import spark_server  # noqa: F401  (session-scoped logjam-spark, shared by every Spark test)

# LOGJAM_NATIVE (logjam/native.py) per test, where the C path and its Python twin both need
# running: `require` (the C, or a failure when it is not built) and `off` (the twin), in one
# pytest run. Tests whose outcome cannot depend on the switch run once, under the LOGJAM_NATIVE
# they inherit (CI: require).
NATIVE_MODES = [pytest.param("require", id="C"), pytest.param("off", id="py")]


@pytest.fixture(params=NATIVE_MODES)
def native_mode(request, monkeypatch) -> str:
    """LOGJAM_NATIVE for this test, once `require` and once `off`: for this process (every
    native.load reads the switch anew) and for every process it starts (tests.helpers.start
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


@dataclass
class DeviceProcess:
    proc: subprocess.Popen
    router_port: int
    pull_port: int
    pub_port: int
    stats_port: int
    device_id: int
    extra: list[str] = field(default_factory=list)
    # The client key that device admits (start_device(keys=...)); None: a plaintext device.
    curve: ClientKey | None = None

    @property
    def router(self) -> str:
        return f"tcp://127.0.0.1:{self.router_port}"

    @property
    def pull(self) -> str:
        return f"tcp://127.0.0.1:{self.pull_port}"

    @property
    def pub(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def stats(self) -> str:
        return f"tcp://127.0.0.1:{self.stats_port}"

    def output(self) -> str:
        """Everything the process printed; only call after it exited."""
        return self.proc.stdout.read() if self.proc.stdout else ""


def start_device(device_id: int = 1, extra: list[str] | None = None, ports: dict[str, int] | None = None,
                 native: str | None = None, keys: Path | None = None) -> DeviceProcess:
    """Start a real `logjam-device` on free ports and wait until it answers a ping.

    `native` sets its LOGJAM_NATIVE (require: the C loop, off: the Python loop); else it inherits ours.
    `keys`: a CURVE key directory (runtime.curve.ensure made it), whose client key then pings; without
    it the device runs with --allow-plaintext, as the tests of everything but CURVE want."""
    ports = ports or {}
    dev = DeviceProcess(
        proc=None,  # type: ignore[arg-type]
        router_port=ports.get("router") or free_port(),
        pull_port=ports.get("pull") or free_port(),
        pub_port=ports.get("pub") or free_port(),
        stats_port=ports.get("stats") or free_port(),
        device_id=device_id,
        extra=list(extra or []),
        curve=ClientKey.from_dir(keys) if keys is not None else None,
    )
    security = ["--keys", str(keys)] if keys is not None else ["--allow-plaintext"]
    # Every device serves `info` on its replay port, journal or not: never the shared default 9607.
    replay = [] if "--replay-port" in dev.extra else ["--replay-port", str(ports.get("replay") or free_port())]
    dev.proc = start([
        command("logjam-device"), "--bind", "127.0.0.1",
        "-t", str(dev.router_port), "-p", str(dev.pull_port),
        "-P", str(dev.pub_port), "-s", str(dev.stats_port), "-d", str(device_id), *replay, *security, *dev.extra,
    ], env={"LOGJAM_NATIVE": native} if native else {})
    ctx = zmq.Context.instance()

    def answers() -> bool:
        if dev.proc.poll() is not None:
            raise AssertionError(f"logjam-device exited early:\n{dev.output()}")
        return pings(dev.router, dev.curve, ctx)

    wait_for(answers, timeout=20, what="logjam-device to answer ping")
    return dev


def pings(router: str, curve: ClientKey | None, ctx: zmq.Context) -> bool:
    """Whether the device at `router` answers a ping from a client with key `curve` (within 0.3 s)."""
    p = Producer(router, context=ctx, timeout=0.3, linger_ms=0, curve=curve)
    try:
        p.ping()
        return True
    except ReplyTimeout:
        return False
    finally:
        p._sock.close()


@pytest.fixture
def device():
    """A running logjam-device with device id 1; stopped (and checked for exit 0) afterwards."""
    dev = start_device()
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
