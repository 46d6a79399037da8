"""Shared by the syslog suites: a `logjam-bridge syslog` (TCP, TLS, RELP, UDP), a RELP client
over a socket, and the check that every message of a run landed once with the documented fields."""

from __future__ import annotations

import socket
import uuid
from typing import Any

from bridges.syslog.relp import RelpClient, Response
from logjam.message import Message
from tests.bridge_support import BridgeProcess, collect, no_more, start_bridge
from harness.processes import free_port, wait_for


def start_syslog(device_router: str, *extra: str, udp: bool = False, **kwargs: Any) -> BridgeProcess:
    """`logjam-bridge syslog`; with `udp`, also on UDP at the same port number."""
    port = kwargs.pop("port", None) or free_port()
    flags = ["--udp-listen", f"127.0.0.1:{port}"] if udp else []
    return start_bridge("syslog", device_router, *flags, *extra, port=port, **kwargs)


def tls_flags(certs) -> list[str]:
    return ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]


def landed_once(sub, app_env: str, run: str, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Exactly the `n` messages `run <i>` (i = 0..n-1) of this run, each once, nothing more; each
    body with the message's meta `created_ms` under `created_ms` (not part of the body)."""
    got: list[tuple[Message, dict[str, Any]]] = collect(sub, app_env, n, timeout=timeout)
    got += [(m, m.json()) for m in no_more(sub, app_env, 1.0)]
    for m, b in got:
        b["created_ms"] = m.meta.created_ms
    bodies = [b for _, b in got if f"run {run} " in b["message"]]
    numbers = sorted(int(b["message"].rsplit(" ", 1)[1]) for b in bodies)
    assert numbers == list(range(n)), f"{len(bodies)} of {n} landed; first missing or doubled: " \
        f"{sorted(set(range(n)) ^ set(numbers))[:10]}"
    assert len(got) == n, f"{len(got) - n} messages too many"
    return bodies


def run_id() -> str:
    return uuid.uuid4().hex[:12]


def relp_send(port: int, messages: list[bytes], *, window: int = 64) -> list[Response]:
    """Open, send `messages` with up to `window` unanswered, close; every rsp, in order."""
    client = RelpClient()
    answers: list[Response] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        def read_until(unanswered: int) -> None:
            while client.unanswered > unanswered:
                data = s.recv(65536)
                assert data, "the bridge closed the RELP connection"
                answers.extend(e for e in client.feed(data) if isinstance(e, Response))

        s.sendall(client.send("open"))
        read_until(0)
        for m in messages:
            s.sendall(client.send("syslog", m))
            read_until(window)
        read_until(0)
        s.sendall(client.send("close"))
        read_until(0)
        wait_for(lambda: s.recv(1) == b"", timeout=10, what="the bridge to close after close")
    return answers
