"""The device's replay endpoint: serves journaled ranges (see logjam/replay.py for the protocol).

It runs in its own thread with its own ROUTER socket, created in that thread, so
that disk reads never stall the publishing loop. A device without a journal runs
it too, answering `info` only (its journal id is per process start, and it holds
nothing). `start_replay` starts it and waits until its socket is bound or failed to bind.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from devices.journal import Gone, Journal
from logjam import sockets
from logjam.errors import ProtocolError
from logjam.replay import BATCH, END, GONE, INFO, PROGRESS, REPLAY, read_journal_id, read_u64, u64

log = logging.getLogger("logjam-device")

CHUNK_MESSAGES = 2000
CHUNK_BYTES = 4 * 1024 * 1024


class ReplayServer(threading.Thread):
    """Answers `info` and `replay`, and takes importers' `progress` reports (devices/lag.py); without a
    journal, `info` from `journal_id` and `last_seq()`."""

    def __init__(
        self, ctx: zmq.Context, journal: Journal | None, stop: threading.Event, *,
        journal_id: str | None = None, last_seq: Callable[[], int] | None = None,
        on_progress: Callable[[str, str, int, float], None] | None = None,
        listen: Callable[[zmq.Socket], None],
    ) -> None:
        super().__init__(name="replay", daemon=True)
        if journal is None and (journal_id is None or last_seq is None):
            raise ValueError("without a journal, the replay endpoint needs journal_id and last_seq")
        self.ctx = ctx
        self.journal = journal
        self.journal_id = journal.journal_id if journal is not None else journal_id
        self._id = self.journal_id.encode("ascii")  # type: ignore[union-attr]
        self._last_seq = last_seq
        self._on_progress = on_progress
        self._listen = listen  # binds the socket (with its CURVE options), in this thread
        self.stop = stop
        self.served = 0
        self.requests = 0
        self.bad = 0
        self.bound = threading.Event()
        # Set instead of `bound` when the endpoint cannot be bound (the device reports it).
        self.error: Exception | None = None

    def run(self) -> None:
        with sockets.eterm_is_clean():
            sock = sockets.socket(self.ctx, zmq.ROUTER, linger_ms=0)
            try:
                try:
                    self._listen(sock)
                except zmq.ZMQError as e:
                    self.error = e
                    return
                self.bound.set()
                while not self.stop.is_set():
                    if sock.poll(200):
                        self._answer(sock, sock.recv_multipart())
            finally:
                sock.close()

    def _progress(self, frames: list[bytes]) -> None:
        """`[progress, journal, seq u64, importer]`: an importer's committed position; never answered."""
        try:
            journal, seq = read_journal_id(frames[2]), read_u64(frames[3])
            name = bytes(frames[4][:128]).decode("utf-8", "replace")
        except ProtocolError as e:
            self.bad += 1
            log.debug("bad progress report: %s", e)
            return
        if self._on_progress is not None:
            self._on_progress(name, journal, seq, time.monotonic())

    def _range(self) -> tuple[int, int]:
        """(first, last) held; first = last + 1 when nothing is."""
        if self.journal is not None:
            return self.journal.first_seq, self.journal.last_seq
        last = self._last_seq()  # type: ignore[misc]
        return last + 1, last

    def _answer(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        self.requests += 1
        rid = frames[0]
        if len(frames) == 2 and frames[1] == INFO:
            first, last = self._range()
            sock.send_multipart([rid, INFO, self._id, u64(first), u64(last)])
            return
        if len(frames) == 5 and frames[1] == PROGRESS:
            self._progress(frames)
            return
        try:
            if len(frames) != 4 or frames[1] != REPLAY:
                raise ProtocolError("a request is [info] or [replay, from u64, to u64]")
            from_seq, to_seq = read_u64(frames[2]), read_u64(frames[3])
        except ProtocolError as e:
            self.bad += 1
            log.debug("bad replay request: %s", e)
            return
        if self.journal is None:
            log.debug("replay request on a device without a journal: not answered")
            return
        self._replay(sock, rid, self.journal, from_seq, to_seq)

    def _replay(self, sock: zmq.Socket, rid: bytes, journal: Journal, from_seq: int, to_seq: int) -> None:
        wanted = max(1, min(CHUNK_MESSAGES, to_seq - from_seq + 1))
        try:
            result = journal.read(from_seq, wanted, CHUNK_BYTES)
        except FileNotFoundError:
            # Retention deleted the segment between the lookup and the open.
            result = Gone(journal.first_seq)
        except (OSError, ProtocolError) as e:
            # A damaged segment must not end the endpoint for every other range; the
            # client gets no answer for this one (and times out).
            log.error("replay of seq %d failed: %s", from_seq, e)
            return
        if isinstance(result, Gone):
            sock.send_multipart([rid, GONE, self._id, u64(result.first_seq)])
            return
        if not result:
            sock.send_multipart([rid, END, self._id, u64(journal.last_seq)])
            return
        out = [rid, BATCH, self._id, u64(from_seq + len(result))]
        for record in result:
            out.extend(record)
        self.served += len(result)
        sock.send_multipart(out, copy=False)


def start_replay(ctx: zmq.Context, journal: Journal | None, stop: threading.Event, *, journal_id: str,
                 last_seq: Callable[[], int], on_progress: Callable[[str, str, int, float], None],
                 listen: Callable[[zmq.Socket], None], port: int) -> ReplayServer | None:
    """The replay endpoint, bound: ranges and `info` with a journal, `info` alone without one.

    A port that cannot be bound fails the start (RuntimeError) when there is a journal;
    without one the device runs on without the endpoint (None).
    """
    replay = ReplayServer(ctx, journal, stop, journal_id=journal_id, last_seq=last_seq,
                          on_progress=on_progress, listen=listen)
    replay.start()
    # The replay socket is created and bound in its own thread; wait for the outcome so
    # that a port in use fails the start like any other port.
    while not replay.bound.wait(0.05):
        if not replay.is_alive():
            break
    if replay.error is not None or not replay.is_alive():
        if journal is not None:
            raise RuntimeError(f"cannot bind the replay port {port}: {replay.error}")
        # Without a journal it only answers `info` (heartbeats carry the same): not worth failing for.
        log.warning("replay port %d: %s; `info` is not served", port, replay.error)
        return None
    return replay
