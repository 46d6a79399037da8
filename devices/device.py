"""The device proper: ROUTER + PULL in, PUB out, renumbering every message it publishes.

This module holds the device's state, its loop and the one place where messages are
numbered. Reading and answering the inputs (the Python drain and the C fast path) is
devices/intake.py; heartbeats, subscriptions and stats devices/heartbeat.py; binding
the sockets devices/listen.py; what metrics and logs read devices/snapshot.py.

`Device(config)` only takes the configuration; `open()` (called by `run()` unless the
entry point called it first, to report a port in use before it says it started)
recovers the journal, creates and binds the sockets with LINGER set, and starts the
replay thread, all in the thread that then runs the loop, after any fork. ETERM is a
clean exit. What the device counts is its `counters` (devices/counters.py).

Everything accepted goes through `_commit`, the one place where messages are
numbered, journaled (with --data-dir) and published, in that order. Replies to
requests are sent after `_commit`, so a 202 is never ahead of the journal or the
publish. When the journal cannot be written, `_commit` holds the batch and the loop
stops reading until a retry succeeds (devices/hold.py). The replay endpoint runs in
its own thread (devices/replay.py).

The loop drains its inputs in batches and consults the poller only when both input
sockets are empty; a heartbeat is the first thing it publishes, and the first thing
every new subscriber gets.
"""

from __future__ import annotations

import logging
import socket as pysocket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import zmq

from logjam import sockets
from logjam.curve import ServerKey
from logjam.meta import now_ms
from devices import listen, native, stamp
from devices.batch import TupleBatch
from devices.config import DeviceConfig
from devices.counters import Counters
from devices.fair import Fairness
from devices.heartbeat import HEARTBEAT, heartbeat_body, publish_stats, take_subscriptions
from devices.hold import Held, JournalHealth
from devices.intake import Intake
from devices.journal import Journal, JournalWriteError, new_journal_id
from devices.lag import ImporterLag
from devices.native import NativeBatch
from devices.replay import ReplayServer, start_replay
from devices.snapshot import importers_snapshot, journal_snapshot
from devices.stamp import FRESH_META
from runtime.curve import Gatekeeper

__all__ = ["Device"]

log = logging.getLogger("logjam-device")

# New subscriptions are taken (each batch of them followed by a heartbeat) at most this often.
WELCOME_EVERY = 0.05


class Device:
    """Holds the configuration, the counters and, once `open()`, the sockets; `run()` serves until `stop` is set."""

    def __init__(self, config: DeviceConfig, context: zmq.Context | None = None) -> None:
        self.config = config
        self.fqdn = pysocket.getfqdn()
        self._fqdn = self.fqdn.encode()
        self.heartbeat_address = f"tcp://{self.fqdn}:{config.pub_port}".encode()
        self._device_id = config.device_id
        stamp.device_bytes(config.device_id)  # range check
        self._device_label = str(config.device_id).encode()
        self._compress = int(config.compress)
        self.counters = Counters()
        self.seq = 0
        # LOGJAM_NATIVE picks the loop (logjam.native); `require` raises here without a build.
        # Loaded even with --compress, so that `require` checks the build in every device.
        loaded = native.load()
        self._loaded = loaded if not self._compress else None  # the C loop does not compress
        self.engine = "native" if self._loaded is not None else "python"
        self._context = context
        self.ctx: zmq.Context | None = None
        self.router = self.pull = self.pub = self.stats = None  # type: ignore[assignment]
        self.intake: Intake | None = None  # reads ROUTER and PULL, set by open()
        self._drains: tuple[Callable[[], int], Callable[[], int]] | None = None  # (PULL, ROUTER), set by open()
        self._thread: int | None = None
        self.gate: Gatekeeper | None = None
        self._server_key: ServerKey | None = None  # CURVE's key pair, read by open()
        self.journal: Journal | None = None
        self.health = JournalHealth()
        self._held: Held | None = None
        self.replay: ReplayServer | None = None
        self._replay_stop = threading.Event()
        self.journal_id = ""
        self.lag: ImporterLag | None = None
        self.fair = Fairness(self.counters, config.max_importer_lag)
        self.ipc_dir: Path | None = None  # set by open(): where the ipc endpoints are, if any

    def open(self) -> "Device":
        """Recover the journal, bind the sockets and start the replay endpoint, in the thread that runs the loop."""
        if self._thread is not None:
            return self
        config = self.config
        if config.curve is not None and config.curve.secret is not None:
            self._server_key = config.curve.load()  # first: a missing key file stops the start before anything exists
        self.ctx = self._context or zmq.Context()
        if config.data_dir is not None and config.ipc:
            self.ipc_dir = listen.open_ipc_dir(config.data_dir)
        listener = self._bind(config)
        if config.data_dir is not None:
            self._open_journal(config)
            self.journal_id = self.journal.journal_id  # type: ignore[union-attr]
        else:
            # No journal: numbering restarts at 1 with every start, so does the identity.
            self.journal_id = new_journal_id()
        self.lag = ImporterLag(self.journal_id, config.max_importer_lag, config.importer_evict_after,
                               max_messages=config.max_importer_lag_messages)
        self.replay = start_replay(self.ctx, self.journal, self._replay_stop,
                                   journal_id=self.journal_id, last_seq=lambda: self.seq,
                                   on_progress=self.lag.progress,
                                   listen=lambda sock: listener.listen(sock, "replay", config.replay_port),
                                   port=config.replay_port)
        self._thread = threading.get_ident()
        return self

    def _bind(self, config: DeviceConfig) -> listen.Listener:
        """Create the loop's four sockets (LINGER set) and bind them; choose the drains that read them.

        Returns the listener, which binds the replay endpoint the same way."""
        linger = config.linger_ms
        ctx = self.ctx
        self.router = sockets.socket(ctx, zmq.ROUTER, linger_ms=linger, rcvhwm=config.rcv_hwm, sndhwm=config.rcv_hwm)
        self.pull = sockets.socket(ctx, zmq.PULL, linger_ms=linger, rcvhwm=config.rcv_hwm)
        # XPUB in manual mode: a subscription counts only once `_welcome` applied it.
        self.pub = sockets.socket(ctx, zmq.XPUB, linger_ms=linger, sndhwm=config.snd_hwm, xpub_manual=1)
        self.stats = sockets.socket(ctx, zmq.PUB, linger_ms=linger)
        self.intake = Intake(self.counters, self._commit, self.router, self.pull,
                             compress=self._compress, fqdn=self._fqdn, loaded=self._loaded)
        self._drains = self.intake.drains
        # CURVE is a socket option set before bind: the C loop reads the same (decrypted) sockets.
        if config.curve is not None and self._server_key is not None:
            self.gate = Gatekeeper(ctx, config.curve.allow_dir)
            self.gate.start()
        listener = listen.Listener(config.bind, self.ipc_dir, config.curve, self._server_key, self.gate)
        for sock, name, port in (
            (self.router, "router", config.router_port),
            (self.pull, "pull", config.pull_port),
            (self.pub, "pub", config.pub_port),
            (self.stats, "stats", config.stats_port),
        ):
            listener.listen(sock, name, port)
        return listener

    def _open_journal(self, config: DeviceConfig) -> None:
        """Open (and recover) the journal and continue its numbering."""
        journal = Journal(
            f"{config.data_dir}/journal",
            fsync=config.journal_fsync,
            fsync_interval_ms=config.journal_fsync_interval_ms,
            segment_bytes=config.journal_segment_bytes,
            retention_bytes=config.journal_retention_bytes or None,
            retention_s=config.journal_retention_hours * 3600 or None,
        )
        self.journal = journal
        self.seq = journal.last_seq

    # -- the one place where messages are numbered and published -----------------

    def _commit(self, batch: TupleBatch | NativeBatch, then: Callable[[], None] | None = None) -> None:
        """Number every message of `batch`, journal the numbered batch, publish it, then call `then`.

        The batch is either Python tuples or the C fast path's zmq_msg_t array; both
        number, journal and publish the same way. The journal append comes before
        anything is published or acknowledged (`then` sends the replies). If it fails
        (a full disk), nothing of the batch was published or acknowledged: the device
        holds it, reads nothing more, and `_retry_held` writes it later.
        """
        first = self.seq + 1
        n = batch.number(self._device_id, first, now_ms())
        journal = self.journal
        if journal is not None:
            try:
                batch.journal(journal, first)
            except JournalWriteError as e:
                self._held = Held(batch, first, n, then)
                self.health.failed(e, n)
                return
            if not self.health.writable:
                self.health.recovered()
        self._published(batch, n, then)

    def _published(self, batch: TupleBatch | NativeBatch, n: int, then: Callable[[], None] | None) -> None:
        self.seq += n
        batch.publish(self.pub)
        self.lag.published(self.seq, time.monotonic())  # type: ignore[union-attr]
        self.counters.published += n
        if then is not None:
            then()

    def _retry_held(self) -> bool:
        """Write the held batch again; on success publish and answer it. True when nothing is held any more."""
        held = self._held
        if held is None:
            return True
        try:
            held.batch.journal(self.journal, held.first)
        except JournalWriteError as e:
            self.health.failed(e, held.count)
            return False
        self._held = None
        self.health.recovered()
        self._published(held.batch, held.count, held.then)
        return True

    # -- timers ----------------------------------------------------------------

    def heartbeat(self) -> None:
        """Publish (and journal) a heartbeat: `{"journal": id, "first": oldest seq still held}`."""
        # Without a journal nothing older than this heartbeat can be had: `first` is its own seq.
        first = self.journal.first_seq if self.journal is not None else self.seq + 1
        body = heartbeat_body(self.journal_id, first)
        self._commit(TupleBatch([(HEARTBEAT, self.heartbeat_address, body, FRESH_META)]), self.counters.heartbeat)

    def _welcome(self) -> None:
        """Apply the subscriptions that arrived since the last call, then publish a heartbeat.

        In manual mode a subscriber gets nothing until its subscription is applied here,
        so the heartbeat (with the journal id) is the first message it receives.
        """
        if take_subscriptions(self.pub):
            self.heartbeat()

    def publish_stats(self) -> None:
        """["stats", device id, last seq, JSON: journal id and whether it can be written]."""
        publish_stats(self.stats, self._device_label, self.seq, self.journal_id, self.health)

    # -- loop --------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set, then take in what is already queued and return.

        Opens the device first unless `open()` was called; either way in this thread, the
        one its sockets belong to.
        """
        self.open()
        if self._thread != threading.get_ident():
            raise RuntimeError("Device.run must run in the thread that opened it (ZeroMQ sockets are not thread-safe)")
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        interval = self.config.heartbeat_interval
        now = time.monotonic()
        next_heartbeat = now + interval
        next_stats = now + 1.0
        next_welcome = now
        # The journal's timer: interval fsyncs (when idle; appends sync too) and retention.
        tick_every = min(1.0, max(0.01, self.config.journal_fsync_interval_ms / 1000))
        next_tick = now + tick_every if self.journal is not None else float("inf")
        monotonic = time.monotonic
        with sockets.eterm_is_clean():
            self.heartbeat()  # the journal id, before anything else is published or journaled
            while not stop.is_set():
                busy = 0
                now = monotonic()
                if self._held is None:
                    busy = self._serve(now)
                    if busy < 0:
                        # Importers are behind: inputs stay unread, so clients see a slow device.
                        busy = 0
                        time.sleep(0.02)
                now = monotonic()
                if now >= next_stats:
                    self.publish_stats()
                    self.fair.tick()
                    next_stats = max(next_stats + 1.0, now + 0.5)
                if now >= next_tick:
                    self._tick()
                    next_tick = now + tick_every
                if self._held is not None:
                    if self.health.due(now) and self._retry_held():
                        continue
                    # The inputs stay unread (they would wake a poll at once): clients see a
                    # slow device, and their own high-water marks and back-pressure hold them.
                    time.sleep(0.05)
                    continue
                if now >= next_welcome:
                    self._welcome()
                    next_welcome = now + WELCOME_EVERY
                if now >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = max(next_heartbeat + interval, now + interval / 2)
                if not busy:
                    wait = min(next_stats, next_heartbeat, next_tick, next_welcome) - now
                    # Short waits keep SIGTERM handling prompt.
                    poller.poll(max(1, min(200, int(wait * 1000) + 1)))
            self._final_drain()

    def _serve(self, now: float) -> int:
        """Read the inputs; past the fair limit park the loud streams (past the hard one, until under it).

        -1: nothing was read because importers are too far behind (the caller waits a little):
        past the hard limit with no loud stream to park, as before devices/fair.py."""
        fair, lag = self.fair, self.lag
        admit = lag.admit(now)  # type: ignore[union-attr]
        if fair.pressing(lag.worst):  # type: ignore[union-attr]
            # Past the hard limit the loud streams stay parked, as every stream's input stayed unread before.
            if admit and fair.overdue(now):
                self._unpark()
                if self._held is not None:
                    return 1
            if fair.full():
                return -1
            before = len(fair.parked)
            intake = self.intake
            busy = intake.drain_python(self.pull, "pull", fair)  # type: ignore[union-attr]
            if self._held is None:
                busy += intake.drain_python(self.router, "router", fair)  # type: ignore[union-attr]
            fair.parking(before)
            return busy
        if not admit:
            return -1
        if fair.parked or fair.replies:
            self._unpark()
            if self._held is not None:
                return 1
        drain_pull, drain_router = self._drains  # type: ignore[misc]
        busy = drain_pull()
        if self._held is None:
            busy += drain_router()
        return busy

    def _unpark(self) -> None:
        """Commit the parked messages (in arrival order, before anything newer), then send the parked replies."""
        batch, replies = self.fair.release()
        then = (lambda: self.intake.reply(replies)) if replies else None  # type: ignore[union-attr]
        if batch:
            self._commit(batch, then)
        elif then is not None:
            then()

    def _tick(self) -> None:
        """The journal's timer; a failed fsync there is a failed write too (counted, logged once)."""
        try:
            synced = self.journal.tick()  # type: ignore[union-attr]
        except JournalWriteError as e:
            self.health.failed(e, self._held.count if self._held is not None else 0)
            return
        if synced and self._held is None and not self.health.writable:
            self.health.recovered()

    def _final_drain(self, budget_s: float = 1.0) -> None:
        """On shutdown, publish what already sits in our input queues (bounded in time)."""
        deadline = time.monotonic() + budget_s
        if self._held is None:
            self._unpark()  # never acknowledged, but already here: publish them rather than make their senders resend
        drain_pull, drain_router = self._drains  # type: ignore[misc]
        while self._retry_held() and time.monotonic() < deadline:
            busy = drain_pull() + drain_router()
            if not busy and self._held is None:
                return
        if self._held is not None:
            log.warning("stopping with %d messages the journal could not take: never published nor acknowledged",
                        self._held.count)

    def close(self) -> None:
        """Stop replay, close the journal (fsync), close sockets with LINGER, end the context."""
        if self.replay is not None:
            self._replay_stop.set()
            self.replay.join(5)
        if self.journal is not None:
            self.journal.close()
        if self.intake is not None:
            self.intake.discard()
        for sock in (self.router, self.pull, self.pub, self.stats):
            if sock is not None:
                sock.close()
        if self.gate is not None:
            self.gate.close()
        if self.ctx is not None:
            self.ctx.term()

    def snapshot(self) -> dict[str, Any]:
        """The counters, the sequence, the journal and the importers' lag: what metrics and logs read."""
        return {"journal_id": self.journal_id, "seq": self.seq, **self.counters.snapshot(),
                "journal": journal_snapshot(self.journal, self.replay, self.health),
                "importers": importers_snapshot(self.lag), "fair": self.fair.snapshot()}
