"""The end-to-end load of benchmarks/e2e.py: Lumberjack events, pre-encoded windows, shipper threads.

One event as the Lumberjack bridge's splice maps it (`body`) is the message the importer sees
for it (benchmarks/importer_decode.py, tests/test_importer_decode_native.py).
"""

from __future__ import annotations

import random
import socket
import threading
import time

import orjson

from bridges.lumberjack.engine import LumberjackClient

WINDOW = 2048
STAMP = "2026-11-23T12:00:00.000Z"  # replaced in benchmarks/e2e.py's main(): now, or --backdate days ago


def event(rnd: random.Random, k: int) -> dict:
    return {"@timestamp": STAMP,
            "message": f"GET /api/v1/users/{rnd.randrange(10**6)}/orders HTTP/1.1 200 {rnd.random() * 200:.1f}ms "
                       f"req={rnd.getrandbits(64):016x}",
            "host": {"name": f"web-{k % 17}.example.net"}, "log": {"offset": k * 120}, "service": "shop"}


def windows(seed: int, count: int, size: int = WINDOW) -> list[bytes]:
    client = LumberjackClient(compress_level=1, restart_each_window=True)
    rnd = random.Random(seed)
    return [client.send([event(rnd, w * size + i) for i in range(size)]) for w in range(count)]


class Shipper(threading.Thread):
    """One connection: sends windows in turn, one in flight, until told to stop; records each ack's time."""

    def __init__(self, port: int, pool: list[bytes], size: int, stop: threading.Event, pace: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.port, self.pool, self.size, self.stop, self.pace = port, pool, size, stop, pace
        self.acked = 0
        self.sent_at: list[float] = []   # per window sent
        self.last_ack = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            acks = LumberjackClient()
            i = 0
            next_at = time.perf_counter()
            while not self.stop.is_set():
                if self.pace:
                    time.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += self.pace
                self.sent_at.append(time.perf_counter())
                sock.sendall(self.pool[i % len(self.pool)])
                i += 1
                done = False
                while not done:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("the bridge closed the connection")
                    done = any(a.seq == self.size for a in acks.feed(data))
                self.acked += self.size
                self.last_ack = time.perf_counter()
            sock.close()
        except BaseException as e:  # reported by the main thread
            self.error = e


def ship(shippers: list[Shipper], seconds: float, stop: threading.Event) -> None:
    """Run the shippers for `seconds`, then stop them and wait for their last acks; a failed one ends the run."""
    for s in shippers:
        s.start()
    time.sleep(seconds)
    stop.set()
    for s in shippers:
        s.join(60)
        if s.error:
            raise SystemExit(f"shipper failed: {s.error!r}")


def body(rnd: random.Random, k: int) -> bytes:
    """One event of benchmarks/e2e.py, as the Lumberjack bridge's splice maps it."""
    event = {"@timestamp": "2026-11-23T12:00:00.000Z",
             "message": f"GET /api/v1/users/{rnd.randrange(10**6)}/orders HTTP/1.1 200 {rnd.random() * 200:.1f}ms "
                        f"req={rnd.getrandbits(64):016x}",
             "host": {"name": f"web-{k % 17}.example.net"}, "log": {"offset": k * 120}, "service": "shop"}
    meta = {"received_at": "2026-11-23T12:00:00.123Z", "peer": "127.0.0.1:41234", "protocol": "lumberjack",
            "protocol_version": "2", "seq": k % 500 + 1, "_id": f"3f9c0a1b2c3d4e5f:{k + 1}"}
    return orjson.dumps(event)[:-1] + b',"@metadata":' + orjson.dumps(meta) + b"}"
