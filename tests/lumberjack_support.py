"""Shared by the Lumberjack bridge and interop tests: a real bridge process, a subscriber
that is known to be connected, and collection of the messages one test sent."""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from logjam.message import Message
from logjam.producer import Producer
from logjam.subscriber import Subscriber
from tests.helpers import command, free_port, port_open, start, stop, wait_for

NODE_DIR = Path(__file__).resolve().parent / "node"


@dataclass
class BridgeProcess:
    proc: subprocess.Popen
    port: int
    app_env: str

    def output(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def start_bridge(device_router: str, *extra: str, app_env: str | None = None) -> BridgeProcess:
    """Start `logjam-bridge lumberjack` on a free port and wait until it accepts."""
    port = free_port()
    app_env = app_env or f"ljtest-{uuid.uuid4().hex[:8]}"
    proc = start([
        command("logjam-bridge"), "lumberjack", "--listen", f"127.0.0.1:{port}",
        "--device", device_router, "--app-env", app_env, "--keepalive-interval", "0.5", *extra,
    ])

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"logjam-bridge exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        return port_open(port)

    wait_for(up, timeout=20, what="logjam-bridge lumberjack to listen")
    return BridgeProcess(proc, port, app_env)


def stop_bridge(bridge: BridgeProcess) -> str:
    code = stop(bridge.proc)
    out = bridge.output()
    print(out)  # shown by pytest when the test fails
    assert code == 0, out
    return out


def ready_subscriber(device_pub: str, device_router: str, app_env: str) -> Subscriber:
    """A subscriber for `app_env` that has provably joined (ZeroMQ's slow joiner)."""
    ctx = zmq.Context.instance()
    sub = Subscriber(device_pub, [app_env], context=ctx)
    probe = Producer(device_router, context=ctx, linger_ms=0)
    try:
        def joined() -> bool:
            probe.send(app_env, "logs.probe", {"probe": True})
            return any(isinstance(m, Message) and m.topic == "logs.probe" for m in sub.recv_batch(timeout=0.1))

        wait_for(joined, timeout=15, what="subscriber to join the device")
    finally:
        probe.close()
    return sub


def collect(sub: Subscriber, app_env: str, n: int, timeout: float = 30.0) -> list[tuple[Message, dict[str, Any]]]:
    """Exactly the next `n` bridge messages for `app_env` (probes and heartbeats skipped)."""
    got: list[tuple[Message, dict[str, Any]]] = []

    def enough() -> bool:
        for m in sub.recv_batch(max_items=5000, timeout=0.2):
            if isinstance(m, Message) and m.app_env == app_env and m.topic != "logs.probe":
                got.append((m, m.json()))
        return len(got) >= n

    wait_for(enough, timeout=timeout, interval=0, what=f"{n} messages (have {len(got)})")
    return got


def no_more(sub: Subscriber, app_env: str, wait: float = 1.0) -> list[Message]:
    """Messages for `app_env` that arrive within `wait` seconds (should be none)."""
    extra = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        for m in sub.recv_batch(max_items=5000, timeout=left):
            if isinstance(m, Message) and m.app_env == app_env and m.topic != "logs.probe":
                extra.append(m)
    return extra
