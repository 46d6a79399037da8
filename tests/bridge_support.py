"""Shared by the bridge test suites (every protocol) and the logjam-send tests: a real
`logjam-bridge` process, a subscriber that is known to be connected, collection of the
messages one test sent, and the two threads of a client that floods a bridge (one sends, one
reads the replies). Protocol-specific helpers stay next to their suites."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import zmq

from logjam.message import Message
from logjam.producer import Producer
from logjam.subscriber import Subscriber
from harness.processes import command, free_port, port_open, start, stop, wait_for
from tests.tls_certs import TestCerts

PROBE_TOPIC = "logs.probe"


@dataclass
class BridgeProcess:
    proc: subprocess.Popen
    port: int
    app_env: str
    data_dir: Path | None = None

    @property
    def to(self) -> str:
        """The `host:port` a client connects to."""
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def start_bridge(protocol: str, device_router: str, *extra: str, data_dir: Path | None = None,
                 app_env: str | None = None, port: int | None = None,
                 prefix: Sequence[str] = (), native: str | None = None) -> BridgeProcess:
    """Start `logjam-bridge <protocol>` on a free port (or `port`) and wait until it accepts.

    `prefix` runs before the bridge's own argv (a wrapper that sets a limit, then execs):
    a preexec_fn would run in a fork of this process, whose other threads (gRPC's, once a
    test used Spark Connect) do not survive a fork, and it once killed the child before exec.
    `native` sets its LOGJAM_NATIVE (require: the C link and scanner, off: their Python twins);
    else it inherits ours (tests.conftest.native_mode sets ours per test)."""
    port = port or free_port()
    app_env = app_env or f"{protocol}test-{uuid.uuid4().hex[:8]}"
    argv = [
        *prefix, command("logjam-bridge"), protocol, "--listen", f"127.0.0.1:{port}", "--device", device_router,
        "--app-env", app_env,
    ]
    if "--keys" not in extra:
        argv.append("--plaintext")  # start_device's devices run without CURVE (tests/test_curve.py)
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    argv += extra
    proc = start(argv, env={"LOGJAM_NATIVE": native} if native else {})

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"logjam-bridge {protocol} exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        return port_open(port)

    wait_for(up, timeout=20, what=f"logjam-bridge {protocol} to listen")
    return BridgeProcess(proc, port, app_env, data_dir)


def stop_bridge(bridge: BridgeProcess) -> str:
    """SIGTERM; the bridge must exit 0. Returns its output."""
    code = stop(bridge.proc)
    out = bridge.output()
    print(out)  # shown by pytest when the test fails
    assert code == 0, out
    return out


def client_tls(certs: TestCerts, *, cert: bool = False, other: bool = False) -> ssl.SSLContext:
    """A client context trusting the test CA; `cert` presents the test client certificate,
    `other` one signed by a CA the bridge does not trust."""
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert:
        ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    if other:
        ctx.load_cert_chain(str(certs.other_client_cert), str(certs.other_client_key))
    return ctx


def ready_subscriber(device_pub: str, device_router: str, app_env: str) -> Subscriber:
    """A subscriber for `app_env` that has provably joined the device (ZeroMQ's slow joiner)."""
    ctx = zmq.Context.instance()
    sub = Subscriber(device_pub, [app_env], context=ctx)
    probe = Producer(device_router, context=ctx, linger_ms=0)
    try:
        def joined() -> bool:
            probe.send(app_env, PROBE_TOPIC, {"probe": True})
            return any(isinstance(m, Message) and m.topic == PROBE_TOPIC for m in sub.recv_batch(timeout=0.1))

        wait_for(joined, timeout=15, what="subscriber to join the device")
    finally:
        probe.close()
    return sub


def ours(m: object, app_env: str) -> bool:
    """A message the bridge published for `app_env` (not a join probe, not a heartbeat)."""
    return isinstance(m, Message) and m.app_env == app_env and m.topic != PROBE_TOPIC


def collect(sub: Subscriber, app_env: str, n: int, timeout: float = 60.0) -> list[tuple[Message, dict[str, Any]]]:
    """Exactly the next `n` bridge messages for `app_env` (probes and heartbeats skipped)."""
    got: list[tuple[Message, dict[str, Any]]] = []

    def enough() -> bool:
        got.extend((m, m.json()) for m in sub.recv_batch(max_items=5000, timeout=0.2) if ours(m, app_env))
        return len(got) >= n

    try:
        wait_for(enough, timeout=timeout, interval=0, what=f"{n} messages")
    except AssertionError as e:
        raise AssertionError(f"{e} (have {len(got)})") from None
    return got


def no_more(sub: Subscriber, app_env: str, wait: float = 1.0) -> list[Message]:
    """Messages for `app_env` that arrive within `wait` seconds (should be none)."""
    extra: list[Message] = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        extra.extend(m for m in sub.recv_batch(max_items=5000, timeout=left) if ours(m, app_env))
    return extra


def drain(sub: Subscriber, app_env: str, wait: float) -> list[tuple[Message, dict[str, Any]]]:
    """Like no_more, with each message's body: what the bridge still forwards within `wait` seconds."""
    return [(m, m.json()) for m in no_more(sub, app_env, wait)]


# -- a client flooding a bridge from two threads (the back-pressure tests): one sends, one reads


def send_unless_halted(sock: socket.socket, data: bytes, halt: threading.Event,
                       progress: Callable[[], None] = lambda: None) -> bool:
    """`data` on `sock` (which has a timeout), whole unless `halt` is set first; True when all of it
    went. `progress` runs after every send that took bytes (a stalled sender stops calling it)."""
    view = memoryview(data)
    while view and not halt.is_set():
        try:
            view = view[sock.send(view):]
            progress()
        except (TimeoutError, BlockingIOError):
            continue
    return not view


def read_replies(sock: socket.socket, feed: Callable[[bytes], Iterable[Any]], into: list, more: Callable[[], bool]) -> None:
    """What `sock` (which has a timeout) receives, through `feed` (a client engine's), into `into`,
    for as long as `more()`; ends early at the end of the stream or when the socket is closed."""
    while more():
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        into.extend(feed(data))
