"""The C fast path for ROUTER and PULL: drain, check, number and publish whole batches.

Why C: pyzmq makes one Python object per received frame and needs one more call per
frame to learn whether another part follows; for a 4-frame message that alone costs
several times what `zmq.proxy` spends on the whole message. native/device.c (built at
install, see native/build.py) holds a batch of messages as `zmq_msg_t`s: `lj_drain` (PULL)
and `lj_drain_router` (ROUTER) receive and check them (the rules of
`logjam.meta`/`logjam.validation`, which the tests cross-check), `lj_number` stamps
device, created_ms and sequence into fresh meta frames, `lj_encode` serializes the
numbered batch into the journal's record format in one pass, `lj_publish` hands the
frames to the PUB socket without copying, and `lj_reply` sends the queued
202/400/pong replies after that. Python keeps the control: `Device._commit`
calls `number`, then `journal` (when the journal is on), then `publish`, exactly as for
the Python path.

`load()` returns None when LOGJAM_NATIVE=off or the module was not built (auto); the
device then runs its pure-Python loop.
"""

from __future__ import annotations

import logging
from typing import Any

from logjam import native

log = logging.getLogger("logjam-device")

MODULE = "devices._native"
# Why a message was dropped, by the codes native/device.h defines (LJ_DROP_*).
REASON_CODES = {1: "frame_count", 2: "broken_meta", 3: "bad_app_env", 4: "bad_topic"}


def load() -> tuple[Any, Any] | None:
    """(ffi, lib) of native/device.c, or None for the Python loop (see logjam.native)."""
    return native.load(MODULE)


class NativeBatch:
    """A batch held in C; `number` and `publish` are what `Device._commit` calls."""

    __slots__ = ("ffi", "lib", "b", "_len", "_out", "_cap")

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self.b = ffi.new("lj_batch_t *")
        self._len = ffi.new("size_t *")
        # The journal encoding buffer: grown on demand, reused for every batch.
        self._out = ffi.NULL
        self._cap = 0

    def __len__(self) -> int:
        return self.b.n

    def drain(self, sock_handle: Any, max_messages: int) -> int:
        return self.lib.lj_drain(self.b, sock_handle, max_messages)

    def drain_router(self, sock_handle: Any, max_messages: int) -> int:
        return self.lib.lj_drain_router(self.b, sock_handle, max_messages)

    def reply(self, sock_handle: Any, fqdn: bytes) -> None:
        self.lib.lj_reply(self.b, sock_handle, fqdn, len(fqdn))

    def number(self, device: int, first_seq: int, now_ms: int) -> int:
        self.lib.lj_number(self.b, device, first_seq, now_ms)
        return self.b.n

    def encode(self) -> Any:
        """The numbered batch as a journal batch body: a buffer valid until the next call."""
        need = self.lib.lj_encode(self.b, self._out, self._cap)
        if need > self._cap:
            self._cap = max(need, 2 * self._cap, 256 * 1024)
            self._out = self.ffi.new("unsigned char[]", self._cap)
            self.lib.lj_encode(self.b, self._out, self._cap)
        return self.ffi.buffer(self._out, need)

    def journal(self, journal: Any, first_seq: int) -> None:
        """Append the numbered batch to `journal` (a devices.journal.Journal), no Python object per message."""
        journal.append_encoded(first_seq, self.b.n, self.encode())

    def publish(self, sock: Any) -> None:
        rc = self.lib.lj_publish(self.b, self.ffi.cast("void *", sock.underlying))
        if rc < 0:
            import zmq

            raise zmq.ZMQError(-rc)

    def frame(self, i: int, k: int) -> bytes:
        ptr = self.lib.lj_data(self.b, i, k, self._len)
        return bytes(self.ffi.buffer(ptr, self._len[0]))

    def drops(self) -> list[tuple[str, bytes]]:
        b = self.b
        return [
            (REASON_CODES[b.drop_reason[j]], bytes(self.ffi.buffer(b.drop_app[j], b.drop_len[j])))
            for j in range(b.ndrops)
        ]

    def app_env_counts(self) -> list[tuple[bytes, int]]:
        """Accepted messages per stream name in this batch."""
        b = self.b
        if b.napps >= 0:
            return [(self.frame(b.app_first[j], 0), b.app_count[j]) for j in range(b.napps)]
        counts: dict[bytes, int] = {}
        for i in range(b.n):
            app = self.frame(i, 0)
            counts[app] = counts.get(app, 0) + 1
        return list(counts.items())

    def discard(self) -> None:
        self.lib.lj_discard(self.b)
