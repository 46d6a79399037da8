"""Helpers for the logjam-device tests (no tests here): raw meta frames, a joined subscriber, metrics scraping."""

from __future__ import annotations

import struct
import time
import urllib.request

import zmq
from prometheus_client.parser import text_string_to_metric_families

from logjam.errors import MetaError
from logjam.meta import Meta
from logjam.validation import is_valid_app_env, is_valid_topic

_META = struct.Struct(">HBBIQQ")
PROBE_APP = b"probe-test"
PROBE_TOPIC = b"logs.probe"


def meta(created_ms: int = 1_700_000_000_123, seq: int = 1, compression: int = 0, *,
         tag: int = 0xCABD, version: int = 1, device: int = 0) -> bytes:
    return _META.pack(tag, compression, version, device, created_ms, seq)


def unpack(frame: bytes) -> Meta:
    return Meta.unpack(frame)


class Tap:
    """A SUB socket on the device's PUB that is known to be joined (no slow-joiner loss).

    Joining: probe messages are PUSHed until one arrives. Probes (and, unless asked
    for, heartbeats) are filtered out of what `recv` returns.
    """

    def __init__(self, pub: str, pull: str, ctx: zmq.Context | None = None, *, subscribe: bytes = b"",
                 keep_heartbeats: bool = False) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.rcvhwm = 0
        self.sub.subscribe(subscribe)
        if subscribe:
            self.sub.subscribe(PROBE_APP)
        self.sub.connect(pub)
        self.keep_heartbeats = keep_heartbeats
        push = self.ctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(pull)
        deadline = time.monotonic() + 10
        try:
            while True:
                push.send_multipart([PROBE_APP, PROBE_TOPIC, b"{}", meta()])
                if self.sub.poll(50) and self._recv_raw(0.01) is not None:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("SUB never joined the device's PUB")
        finally:
            push.close()
        self.probes_seen = True

    def _recv_raw(self, timeout: float) -> list[bytes] | None:
        if not self.sub.poll(int(timeout * 1000)):
            return None
        return self.sub.recv_multipart()

    def recv(self, timeout: float = 5.0) -> list[bytes] | None:
        """The next published message that is not a probe (None after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            frames = self._recv_raw(remaining)
            if frames is None:
                return None
            if frames[0] == PROBE_APP:
                continue
            if frames[0] == b"heartbeat" and not self.keep_heartbeats:
                continue
            return frames

    def expect(self, timeout: float = 5.0) -> list[bytes]:
        frames = self.recv(timeout)
        assert frames is not None, "nothing was published"
        return frames

    def quiet(self, timeout: float = 0.5) -> bool:
        """True if nothing (but probes) is published within `timeout`: proves a drop."""
        return self.recv(timeout) is None

    def close(self) -> None:
        self.sub.close()


def dealer(router: str, ctx: zmq.Context | None = None) -> zmq.Socket:
    s = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
    s.linger = 0
    s.connect(router)
    return s


def push(pull: str, ctx: zmq.Context | None = None) -> zmq.Socket:
    s = (ctx or zmq.Context.instance()).socket(zmq.PUSH)
    s.linger = 2000
    s.connect(pull)
    return s


def reply(sock: zmq.Socket, timeout: float = 5.0) -> list[bytes]:
    assert sock.poll(int(timeout * 1000)), "no reply from the device"
    return sock.recv_multipart()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample from /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def classify(frames: list[bytes]) -> str | None:
    """Why the device must drop a PULL message (or a request's frames), by the library's rules."""
    if len(frames) not in (3, 4):
        return "frame_count"
    if len(frames) == 4:
        try:
            Meta.unpack(frames[3])
        except MetaError:
            return "broken_meta"
    if not is_valid_app_env(frames[0]):
        return "bad_app_env"
    if not is_valid_topic(frames[1]):
        return "bad_topic"
    return None
