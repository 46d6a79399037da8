"""A whole mesh under the real supervisord on test ports, and helpers to drive and query it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import orjson
from pylogbeat import PyLogBeatClient

from logjam.compression import decompress
from tools.mesh import DEFAULTS, DEVICE_PORTS, device_port, ensure_keys, mesh_environment
from logjam.curve import ClientKey
from logjam.message import Message
from logjam.producer import Producer
from logjam.replay import ReplayClient
from harness.mesh import PORT_STEP, mesh_ports
from harness.processes import REPO, command, port_open, wait_for


PROTOCOL_PORTS = {
    "lumberjack": "LOGJAM_LUMBERJACK_PORT",
    "courier": "LOGJAM_COURIER_PORT",
    "segment": "LOGJAM_SEGMENT_PORT",
    "rustlog": "LOGJAM_RUSTLOG_PORT",
    "otlp": "LOGJAM_OTLP_HTTP_PORT",
    "syslog": "LOGJAM_RELP_PORT",  # logjam-send syslog speaks RELP
}


class Mesh:
    def __init__(self, data_dir: Path, devices: int = 2, importers: int = 2, extra: dict[str, str] | None = None) -> None:
        base = dict(os.environ)
        for key in DEFAULTS:
            base.pop(key, None)
        base.update(mesh_ports(devices, importers))
        base.update(LOGJAM_DATA_DIR=str(data_dir), LOGJAM_BIND="127.0.0.1", LOGJAM_IMPORTERS=str(importers),
                    LOGJAM_DEVICES=str(devices), LOGJAM_DEVICE_PORT_STEP=str(PORT_STEP), LOGJAM_SPARK_MASTER="local[2]")
        base.update(extra or {})
        self.devices = devices
        self.importers = importers
        self.config = REPO / "supervisord.conf"
        self.env = mesh_environment(self.config, base)
        # As `make up` does before supervisord starts anything; tests connect with the client key.
        self.key = ClientKey.from_dir(ensure_keys(self.env))
        self.proc = subprocess.Popen(
            [command("supervisord"), "-c", str(self.config), "-n"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def port(self, key: str, device: int = 0) -> int:
        """The port of `key`; for a per-device port (tools.mesh.DEVICE_PORTS), device `device`'s."""
        return device_port(self.env, key, device) if key in DEVICE_PORTS else int(self.env[key])

    def device_id(self, device: int) -> int:
        return int(self.env["LOGJAM_DEVICE_ID"]) + device

    def ctl(self, *args: str) -> str:
        return subprocess.run(
            [command("supervisorctl"), "-c", str(self.config), *args], env=self.env,
            capture_output=True, text=True, timeout=60,
        ).stdout

    def states(self) -> dict[str, tuple[str, str]]:
        out = {}
        for line in self.ctl("status").splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out[parts[0]] = (parts[1], line)
        return out

    def pid(self, name: str) -> int:
        return int(self.ctl("pid", name).strip())

    def sql(self, query: str) -> list[dict]:
        res = subprocess.run(
            [command("logjam-sql"), "--json", "--max-rows", "0", "--spark", f"sc://127.0.0.1:{self.port('LOGJAM_SPARK_PORT')}",
             "--warehouse", f"{self.env['LOGJAM_DATA_DIR']}/warehouse", query],
            capture_output=True, text=True, timeout=120,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return [orjson.loads(line) for line in res.stdout.splitlines() if line.strip()]

    def logs(self) -> str:
        out = []
        for path in sorted(Path(self.env["LOGJAM_DATA_DIR"], "logs").glob("*.log")):
            out.append(f"== {path.name}\n" + path.read_text(errors="replace")[-2000:])
        return "\n".join(out)

    def shutdown(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def running_mesh(tmp_path_factory, ready_timeout: float = 180, **mesh_args):
    """Generator for a module-scoped fixture: a mesh that is up and importing (`mesh_args` go to Mesh)."""
    m = Mesh(tmp_path_factory.mktemp("mesh") / "data", **mesh_args)
    try:
        def up() -> bool:
            assert m.proc.poll() is None, "supervisord exited"
            states = m.states()
            return (
                len(states) == 8 + m.devices + m.importers and all(s == "RUNNING" for s, _ in states.values())
                and all(port_open(m.port(k)) for k in PROTOCOL_PORTS.values())
                and port_open(m.port("LOGJAM_SPARK_PORT"))
            )

        try:
            wait_for(up, timeout=240, interval=1, what="every program RUNNING and listening")
            # RUNNING is not subscribed: importers first wait for Spark. Until the
            # lossless-delivery journal exists, PUB/SUB drops what a subscriber has not
            # joined for, so wait until probes reach Spark through both workers.
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
