"""Helpers for tests that drive a whole mesh (harness.mesh.Mesh, the one way tests and benchmarks run
one): a mesh of a test's own (`started_mesh`), probes, sending through every path, and what landed.
The mesh most tests share is tests/mesh_conftest_plugin.py's `shared_mesh`."""

from __future__ import annotations

import re
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import orjson
from pylogbeat import PyLogBeatClient

from logjam.compression import decompress
from logjam.message import Message
from logjam.producer import Producer
from logjam.replay import ReplayClient
from harness.mesh import Mesh
from harness.processes import command, wait_for

# LOGJAM_* settings of every test mesh over the defaults: two Spark cores, whatever the host has.
TEST_SETTINGS = {"LOGJAM_SPARK_MASTER": "local[2]"}

PROTOCOL_PORTS = {
    "lumberjack": "LOGJAM_LUMBERJACK_PORT",
    "courier": "LOGJAM_COURIER_PORT",
    "segment": "LOGJAM_SEGMENT_PORT",
    "rustlog": "LOGJAM_RUSTLOG_PORT",
    "otlp": "LOGJAM_OTLP_HTTP_PORT",
    "syslog": "LOGJAM_RELP_PORT",  # logjam-send syslog speaks RELP
}


@contextmanager
def started_mesh(data: Path, ready_timeout: float = 180, **mesh_args) -> Iterator[Mesh]:
    """A mesh that is up and importing (`mesh_args` go to Mesh; `extra` over TEST_SETTINGS); shut down after.

    Up (every program RUNNING, every importer subscribed) within `ready_timeout` + 60 s; then, as
    PUB/SUB drops what a subscriber has not joined for, probes until they reach Spark through every
    device and importer, within `ready_timeout`.
    """
    extra = {**TEST_SETTINGS, **mesh_args.pop("extra", {})}
    m = Mesh(data, extra=extra, session=False, ready_timeout=ready_timeout + 60, **mesh_args)
    try:
        try:
            wait_until_importing(m, f"ready-{uuid.uuid4().hex[:8]}", timeout=ready_timeout)
        except AssertionError:
            raise AssertionError(f"mesh did not come up: {m.states()}\n{m.logs()}") from None
        yield m
    finally:
        m.shutdown()


def wait_until_importing(mesh: Mesh, marker: str, timeout: float = 180) -> None:
    """Send probes through every device (so every importer) until one from each lands in Spark."""
    rounds = 0

    def probe() -> bool:
        nonlocal rounds
        rounds += 1
        for k in range(mesh.devices):
            with Producer(f"tcp://127.0.0.1:{mesh.port('LOGJAM_ROUTER_PORT', k)}", curve=mesh.key) as p:
                for app_env in ("lumberjack-default", "mesh-a"):
                    p.submit(app_env, "logs.mesh", {"message": f"{marker} {rounds}"})
                p.flush()
        rows = mesh.sql(f"SELECT DISTINCT device, app_env FROM messages WHERE body LIKE '%{marker}%'")
        return {(r["device"], r["app_env"]) for r in rows} == {
            (mesh.device_id(k), a) for k in range(mesh.devices) for a in ("lumberjack-default", "mesh-a")}

    wait_for(probe, timeout=timeout, interval=2, what="probes through every device and importer")


def probe_every_device(mesh: Mesh, marker: str, timeout: float = 180) -> None:
    """One probe per device and importer (app-envs of both workers), sent once, until all of them land.

    Sent once, not per round as `wait_until_importing` does: nothing of it lands after this returns
    (a test counting a whole table next sees no stray rows)."""
    want = {(mesh.device_id(k), a) for k in range(mesh.devices) for a in ("lumberjack-default", "mesh-a")}
    for k in range(mesh.devices):
        with Producer(f"tcp://127.0.0.1:{mesh.port('LOGJAM_ROUTER_PORT', k)}", curve=mesh.key) as p:
            for app_env in ("lumberjack-default", "mesh-a"):
                p.submit(app_env, "logs.mesh", {"message": f"{marker} d{k}"})
            assert p.flush().accepted == 2, f"device {k} did not accept the probe"

    def landed_all() -> bool:
        rows = mesh.sql(f"SELECT DISTINCT device, app_env FROM messages WHERE body LIKE '%{marker}%'")
        return {(r["device"], r["app_env"]) for r in rows} == want

    wait_for(landed_all, timeout=timeout, interval=2, what=f"probe {marker} through every device and importer")


def send(mesh: Mesh, protocol: str, lines: list[str]) -> None:
    port = mesh.port(PROTOCOL_PORTS[protocol]) if protocol != "logjam" else mesh.port("LOGJAM_ROUTER_PORT")
    res = subprocess.run(
        [command("logjam-send"), protocol, "--to", f"127.0.0.1:{port}", *lines],
        capture_output=True, text=True, timeout=60, env=mesh.env,  # LOGJAM_DATA_DIR: where the key is
    )
    assert res.returncode == 0, f"logjam-send {protocol}: {res.stderr}"


def send_everywhere(mesh: Mesh, run: str, n: int) -> dict[str, str]:
    """n events per path; returns marker -> the path it went through."""
    expected: dict[str, str] = {}

    def lines(path: str) -> list[str]:
        out = [f"{run} {path} {i}" for i in range(n)]
        expected.update({line: path for line in out})
        return out

    client = PyLogBeatClient("127.0.0.1", mesh.port("LOGJAM_LUMBERJACK_PORT"), ssl_enable=False, use_logging=False)
    client.connect()
    client.send([{"message": line, "@timestamp": "2026-11-21T10:00:00.000Z"} for line in lines("pylogbeat")])
    client.close()
    for protocol in ("courier", "segment", "rustlog", "otlp", "syslog"):
        send(mesh, protocol, lines(protocol))
    router = f"tcp://127.0.0.1:{mesh.port('LOGJAM_ROUTER_PORT')}"
    with Producer(router, curve=mesh.key) as dealer:
        for line in lines("dealer"):
            dealer.submit("mesh-a", "logs.mesh", {"message": line})
        assert dealer.flush().accepted == n
    with Producer(f"tcp://127.0.0.1:{mesh.port('LOGJAM_PULL_PORT')}", mode="push", curve=mesh.key) as push:
        for line in lines("push"):
            push.send("mesh-b", "logs.mesh", {"message": line})
    return expected


EXPECTED_ROUTE = {
    "pylogbeat": ("lumberjack-default", "logs.lumberjack", "lumberjack"),
    "courier": ("courier-default", "logs.courier", "courier"),
    "segment": ("segment-default", "logs.segment", "segment"),
    "rustlog": ("rustlog-default", "logs.rustlog", "rustlog"),
    "otlp": ("otlp-default", "logs.otlp", "otlp"),
    "syslog": ("syslog-default", "logs.syslog", "syslog"),
    "dealer": ("mesh-a", "logs.mesh", None),
    "push": ("mesh-b", "logs.mesh", None),
}


def landed(mesh: Mesh, run: str) -> list[dict]:
    return mesh.sql(
        f"SELECT app_env, topic, device, seq, event_id, body, parse_error FROM messages WHERE body LIKE '%{run}%'"
    )


def repeated_event_ids(mesh: Mesh) -> list[dict]:
    """Every non-NULL event_id that has more than one row anywhere in the table (the importer's
    exactly-once claim is that there are none)."""
    return mesh.sql(
        "SELECT event_id, count(*) AS n, collect_set(app_env) AS app_envs FROM messages "
        "WHERE event_id IS NOT NULL GROUP BY event_id HAVING count(*) > 1 ORDER BY n DESC LIMIT 20"
    )


def journaled(mesh: Mesh, run: str, from_seq: dict[int, int]) -> list[dict]:
    """The devices' journals' copies of run `run`'s events, from seq `from_seq[device id]` of each device
    named there, read back through their replay endpoints: one {"device", "seq", "body"} per journaled
    message (a copy journaled twice is two)."""
    needle = run.encode()
    out = []
    for device, first in sorted(from_seq.items()):
        k = device - mesh.device_id(0)
        client = ReplayClient(f"tcp://127.0.0.1:{mesh.port('LOGJAM_REPLAY_PORT', k)}", timeout=30, curve=mesh.key)
        try:
            for msg in client.fetch(first, 2**63 - 1):
                assert isinstance(msg, Message), f"device {device}'s journal lost {msg} within the test's range"
                body = decompress(msg.meta.compression, msg.body)
                if needle in body:
                    out.append({"device": device, "seq": msg.meta.seq, "body": orjson.loads(body)})
        finally:
            client.close()
    return out


_SKIPPED = re.compile(r"duplicates: skipped (\d+) events whose @metadata\._id was already written")


def importer_duplicates_dropped(mesh: Mesh) -> int:
    """Events the importers dropped by @metadata._id so far, summed from their logs' 5-second summaries.

    The summary survives a SIGKILLed importer, which its metrics port does not; a count an
    importer had not logged yet when it was SIGKILLed is not in it.
    """
    total = 0
    for path in Path(mesh.env["LOGJAM_DATA_DIR"], "logs").glob("logjam-importer-*.log"):
        total += sum(int(n) for n in _SKIPPED.findall(path.read_text(errors="replace")))
    return total


def wait_landed(mesh: Mesh, run: str, want: int, timeout: float = 180) -> list[dict]:
    rows: list[dict] = []

    def enough() -> bool:
        rows[:] = landed(mesh, run)
        return len(rows) >= want

    try:
        wait_for(enough, timeout=timeout, interval=2, what=f"{want} rows of run {run} in Spark")
    except AssertionError:
        raise AssertionError(f"only {len(rows)} of {want} rows landed\n{mesh.logs()}") from None
    return rows
