"""The ceiling a bridge benchmark cannot beat on this machine: the device path fed by a free producer.

Every bridge publishes one Logjam request per event and waits for the device's 202,
so events/s through bridge + device can never exceed what the device (plus the
benchmark's subscriber, where there is one) manages when its producer costs nothing.
`device_ceiling()` measures exactly that, in the same run and on the same bodies: one
DEALER sending pre-encoded requests through the link's C sender, many in flight,
replies drained in C, and a SUB counting in C. Bridge benchmarks print it next to
their ratio, so a target above the ceiling is visible as such.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from bridges.host.native_link import wire  # noqa: E402
from logjam.message import Message, MessageBatch  # noqa: E402
from harness.processes import wait_for  # noqa: E402


def counting_sub(router: str, pub: str, prefix: str) -> zmq.Socket:
    """A SUB on `prefix`, joined (probes published until one arrives, then drained) and ready to count."""
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    sub.connect(pub)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(router)
    try:
        def joined() -> bool:
            dealer.send_multipart(Message.build(prefix, "logs.probe", {"p": 1}).to_frames())
            return bool(sub.poll(50))
        wait_for(joined, timeout=15, interval=0.05, what="counting subscriber to join")
        while sub.poll(300):
            sub.recv_multipart()
    finally:
        dealer.close()
    return sub


class Counter(threading.Thread):
    """Counts `n` whole messages on a SUB in C (the GIL is released while it waits); `.done_at` when all came."""

    def __init__(self, sub: zmq.Socket, n: int) -> None:
        super().__init__(daemon=True)
        self.sub, self.n = sub, n
        self.counted = 0
        self.done_at: float | None = None
        self.start()

    def run(self) -> None:
        self.counted = wire().count(self.sub, self.n)
        if self.counted == self.n:
            self.done_at = time.perf_counter()


def device_ceiling(router: str, bodies: list[bytes], *, app_env: str, pub: str | None = None,
                   inflight: int = 8192) -> float:
    """Messages/s through the device (and a counting subscriber when `pub` is given)."""
    w = wire()
    ctx = zmq.Context.instance()
    app_env = f"{app_env}-ceiling"
    sub = counting_sub(router, pub, app_env) if pub is not None else None
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(router)
    n = len(bodies)
    app, topic = app_env.encode(), b"logs.ceiling"
    prepared = w.prepare(MessageBatch(app_env, topic.decode(), bodies=bodies, created_ms=[int(time.time() * 1000)] * n))
    counter = Counter(sub, n) if sub is not None else None
    sent = answered = 0
    t0 = time.perf_counter()
    while answered < n:
        if sent < n and sent - answered < inflight:
            sent += w.send(dealer, app, topic, 0, prepared, sent, min(n, answered + inflight))
        k, statuses = w.drain(dealer)
        if statuses is not None:
            raise SystemExit(f"device refused ceiling messages: {set(statuses)}")
        answered += k
        if not k and (sent == n or sent - answered >= inflight):
            dealer.poll(100)
    end = time.perf_counter()
    dealer.close()
    if counter is not None and sub is not None:
        counter.join(30)
        sub.close()
        if counter.done_at is None:
            raise SystemExit(f"ceiling subscriber counted {counter.counted} of {n}")
        end = max(end, counter.done_at)
    return n / (end - t0)


def describe(ceiling: float, reference: float, what: str = "device") -> str:
    return (f"ceiling ({what} fed by a producer that costs nothing, same bodies): "
            f"{ceiling:12,.0f} events/s = {ceiling / reference:.2f}x of decode-only")
