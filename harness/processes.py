"""Real processes for tests and benchmarks: free ports, polling with a deadline, starting and stopping."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by bind(0) come from the kernel's ephemeral range, the same range every
# outgoing connection takes its local port from; a port picked that way can be taken by
# some client's connect() before the server under test binds it (seen: "Address already
# in use"). Picking below that range leaves only our own servers to collide with.
_ALL_PORTS = range(10000, max(10001, _ephemeral_start()))


def _worker_ports(ports: range) -> range:
    """This pytest-xdist worker's own slice of `ports` (all of them outside xdist).

    `_given` below keeps one process from handing out a port twice, but the workers (`-n 3`:
    PYTEST_XDIST_WORKER gw0, gw1, gw2) would each pick from the same range, and a port one picked
    stays unbound until its server starts (seconds, for a whole mesh): disjoint slices keep them
    from colliding.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return ports
    size = len(ports) // int(count)
    start = ports.start + int(worker[2:]) * size
    return range(start, start + size)


_PORTS = _worker_ports(_ALL_PORTS)
_rng = random.SystemRandom()
# A port is free until its server binds it, which may be seconds later (a whole mesh is
# configured before it starts): never hand out one port twice in a process.
_given: set[int] = set()


def free_port() -> int:
    for _ in range(100):
        port = _rng.choice(_PORTS)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _given.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int, step: int) -> int:
    """A free port p with p + k*step free too for k < n (none of them handed out again)."""
    for _ in range(200):
        port = free_port()
        others = [port + k * step for k in range(1, n)]
        if any(o in _given or o not in _PORTS for o in others):  # not into another worker's slice
            continue
        ok = True
        for o in others:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", o))
                except OSError:
                    ok = False
                    break
        if ok:
            _given.update(others)
            return port
    raise AssertionError(f"no {n} free ports {step} apart")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class StartFailed(AssertionError):
    """A process that exited, went quiet or outlasted its bound before it was ready; the message
    says which, with the tail of what it printed."""


def log_tail(log: Path, lines: int = 60, limit: int = 8000) -> str:
    """The last `lines` lines of a process's log (at most `limit` characters), for a failure message."""
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        return f"(its log {log} cannot be read: {e})"
    tail = "\n".join(text.splitlines()[-lines:])[-limit:]
    return tail or "(its log is empty)"


def wait_for_start(proc: subprocess.Popen, ready: Callable[[], T], log: Path, *, what: str,
                   ports: Sequence[int] = (), quiet: float = 180.0, limit: float = 900.0,
                   interval: float = 0.25) -> T:
    """Poll `ready` while `proc` starts, for as long as it shows progress; raises StartFailed.

    A start on a loaded machine can take many times its usual wall time and still be sound, so
    there is no fixed deadline: the wait fails as soon as `proc` exits, once `quiet` seconds pass
    in which its `log` did not grow and none of `ports` opened, or after `limit` seconds in all.
    """
    begun = last = time.monotonic()
    size = -1
    opened: set[int] = set()
    while True:
        code = proc.poll()
        if code is not None:
            raise StartFailed(f"{what}: the process exited with {code} before it was ready; its log ends:\n"
                              f"{log_tail(log)}")
        result = ready()
        if result:
            return result
        now = time.monotonic()
        try:
            grown = log.stat().st_size
        except OSError:
            grown = -1
        newly = {p for p in ports if p not in opened and port_open(p)}
        if grown != size or newly:
            size, last = grown, now
            opened |= newly
        elif now - last > quiet:
            raise StartFailed(f"{what}: no new output and no port opened for {now - last:.0f}s "
                              f"({now - begun:.0f}s since the start); its log ends:\n{log_tail(log)}")
        if now - begun > limit:
            raise StartFailed(f"{what}: not ready after {now - begun:.0f}s, though still making progress; "
                              f"its log ends:\n{log_tail(log)}")
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def command(name: str) -> str:
    """Path of a console script installed in this venv."""
    return str(BIN / name)


def start(argv: list[str], **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(kwargs.pop("env", {}))
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def stop(proc: subprocess.Popen, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int:
    """`sig` (SIGTERM), then wait; returns the exit code (kills and fails loudly on a hang)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{proc.args[0]} did not exit within {timeout}s of {signal.Signals(sig).name}") from None
    return proc.returncode

