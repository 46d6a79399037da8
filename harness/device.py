"""A real `logjam-device` on free ports, for tests and benchmarks: start it, wait until it answers a ping."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from harness.processes import command, free_port, start, wait_for
from logjam.curve import ClientKey
from logjam.producer import Producer, ReplyTimeout


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
