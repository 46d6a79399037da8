"""The device's replay endpoint: serves journaled ranges (see logjam/replay.py for the protocol).

It runs in its own thread with its own ROUTER socket, created in that thread, so
that disk reads never stall the publishing loop.
"""

from __future__ import annotations

import logging
import threading

import zmq

from devices.journal import Gone, Journal
from logjam import lifecycle
from logjam.errors import ProtocolError
from logjam.replay import BATCH, END, GONE, REPLAY, read_u64, u64

log = logging.getLogger("logjam-device")

CHUNK_MESSAGES = 2000
CHUNK_BYTES = 4 * 1024 * 1024


class ReplayServer(threading.Thread):
    def __init__(self, ctx: zmq.Context, journal: Journal, endpoint: str, stop: threading.Event) -> None:
        super().__init__(name="replay", daemon=True)
        self.ctx = ctx
        self.journal = journal
        self.endpoint = endpoint
        self.stop = stop
        self.served = 0
        self.requests = 0
        self.bad = 0
        self.bound = threading.Event()
        # Set instead of `bound` when the endpoint cannot be bound (the device reports it).
        self.error: Exception | None = None

    def run(self) -> None:
        with lifecycle.eterm_is_clean():
            sock = lifecycle.socket(self.ctx, zmq.ROUTER, linger_ms=0)
            try:
                try:
                    sock.bind(self.endpoint)
                except zmq.ZMQError as e:
                    self.error = e
                    return
                self.bound.set()
                while not self.stop.is_set():
                    if sock.poll(200):
                        self._answer(sock, sock.recv_multipart())
            finally:
                sock.close()

    def _answer(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        self.requests += 1
        rid = frames[0]
        try:
            if len(frames) != 4 or frames[1] != REPLAY:
                raise ProtocolError("a replay request is [replay, from u64, to u64]")
            from_seq, to_seq = read_u64(frames[2]), read_u64(frames[3])
        except ProtocolError as e:
            self.bad += 1
            log.debug("bad replay request: %s", e)
            return
        wanted = max(1, min(CHUNK_MESSAGES, to_seq - from_seq + 1))
        try:
            result = self.journal.read(from_seq, wanted, CHUNK_BYTES)
        except FileNotFoundError:
            # Retention deleted the segment between the lookup and the open.
            result = Gone(self.journal.first_seq)
        except (OSError, ProtocolError) as e:
            # A damaged segment must not end the endpoint for every other range; the
            # client gets no answer for this one (and times out).
            log.error("replay of seq %d failed: %s", from_seq, e)
            return
        if isinstance(result, Gone):
            sock.send_multipart([rid, GONE, u64(result.first_seq)])
            return
        if not result:
            sock.send_multipart([rid, END, u64(self.journal.last_seq)])
            return
        out = [rid, BATCH, u64(from_seq + len(result))]
        for record in result:
            out.extend(record)
        self.served += len(result)
        sock.send_multipart(out, copy=False)
