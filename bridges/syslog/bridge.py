"""`logjam-bridge syslog`: syslog over TCP, TLS and UDP, and RELP, forwarded to the device.

One process serves one stream transport on `--listen`: plain syslog (RFC 6587, octet
counting or LF framing, told apart per message; TLS, RFC 5425, when --tls-cert is given), or
RELP with `--relp`. `--udp-listen` adds a UDP socket (RFC 5426) beside it. `make up` runs
two of them (plain TCP with UDP, and RELP; TLS is added by hand, since the mesh has no server
certificate to give it); docs/protocols/syslog.md has the mapping.

What a sender can lose follows from its transport:
- plain syslog over TCP or TLS has no acknowledgement: the bridge forwards what it reads,
  and whatever sits in the sender's socket buffers, ours or the device link when a bridge
  dies is gone (at-most-once);
- UDP the same, plus whatever the kernel or the bridge drops under load (counted in
  logjam_bridge_datagrams_dropped);
- RELP answers each `syslog` frame with `rsp 200 OK` only once the device has accepted the
  message (its 202), in the order the frames came, through the host's `Pipeline`; what
  was not answered is sent again by librelp after a reconnect (at-least-once; the
  importer drops copies only where `_id` matches, and a resent RELP frame gets a new one,
  so a resend after a bridge crash can land twice).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import Counter

from bridges.host import Batches, BridgeProtocol, Connection, EventMapper, Host, forward
from bridges.host.config import HostConfig, Knobs
from bridges.host.datagram import DatagramListener, listen_datagrams
from bridges.host.server import split_listen
from bridges.host.session import PipelineSession
from bridges.syslog.encode import MODULE as ENCODER_MODULE
from bridges.syslog.encode import Metadata
from bridges.syslog.encode import native as native_encoder
from bridges.syslog.engine import DATAGRAM, DEFAULT_MAX_FRAME, Frames, SyslogServer, datagram_message
from bridges.syslog.parse import parse_timed
from bridges.syslog.receive import reader as datagram_reader
from bridges.syslog.relp import Close, Open, RelpServer, Response, ServerClose, Syslogs, open_answer
from logjam import defaults, native
from logjam.meta import now_ms
from logjam.validation import is_valid_app_env
from runtime.config import from_flags

log = logging.getLogger("logjam-bridge.syslog")

UDP_FLUSH_EVENTS = 256
# How long the first datagram of a batch waits for others (unless UDP_FLUSH_EVENTS come first).
UDP_GATHER_SECONDS = 0.002
# UDP batches at the device at once. Beyond that, datagrams gather in one waiting batch of
# at most UDP_FLUSH_EVENTS, sent when a batch at the device is done; past it they are dropped (counted).
UDP_MAX_BATCHES = 64


@dataclass(frozen=True, slots=True)
class SyslogConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there)."""

    relp: bool
    udp_listen: str | None
    app_name_environment: str | None

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "SyslogConfig":
        """The config of these flags; ValueError says what is wrong (at start and under --check)."""
        config = from_flags(cls, args)
        if config.udp_listen is not None:
            split_listen(config.udp_listen)
        if config.app_name_environment is not None and not is_valid_app_env(f"a-{config.app_name_environment}"):
            raise ValueError(f"--app-name-environment {config.app_name_environment!r} cannot end a stream name")
        return config


class AppEnv:
    """app-env of one message: `<APP-NAME>-<--app-name-environment>` when that flag is set and
    the result is a valid stream name, else --app-env (a fallback is counted)."""

    def __init__(self, host: Host, environment: str | None) -> None:
        self.default = host.config.app_env
        self.environment = environment
        self.fallback = host.metrics.app_env_fallbacks
        self._cache: dict[str, str] = {}

    def __call__(self, body: dict[str, Any]) -> str:
        if self.environment is None:
            return self.default
        name = body["syslog"].get("app_name")
        if name is None:
            self.fallback.inc()
            return self.default
        app_env = self._cache.get(name)
        if app_env is None:
            candidate = f"{name}-{self.environment}"
            app_env = candidate if is_valid_app_env(candidate) else ""
            if len(self._cache) < 4096:
                self._cache[name] = app_env
        if not app_env:
            self.fallback.inc()
            return self.default
        return app_env


class Bridge(BridgeProtocol):
    name = "syslog"
    default_port = defaults.BRIDGE_PORTS["syslog"]
    default_max_frame = DEFAULT_MAX_FRAME
    default_idle_timeout = 3600.0
    Config = SyslogConfig
    # RELP's window is rsyslog's (128 by default): up to 16 batches of 256 at the device. No keepalive:
    # a RELP client waits for its rsp as long as its own timeout says.
    knobs = Knobs(pipeline_depth=16, batch_size=256, renamed=(("max_pending_batches", "pipeline_depth"),))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("syslog")
        g.add_argument("--relp", action="store_true",
                       help="speak RELP on --listen (rsyslog's omrelp; acknowledged, at-least-once) "
                            "instead of syslog over TCP")
        g.add_argument("--udp-listen", metavar="HOST:PORT",
                       help="also take syslog datagrams (RFC 5426) here; no acknowledgement is possible")
        g.add_argument("--app-name-environment", metavar="ENV",
                       help="app-env is <APP-NAME>-ENV of each message (--app-env when it has none)")

    def __init__(self, config: SyslogConfig, host: Host) -> None:
        super().__init__(config, host)
        self.app_env = AppEnv(host, config.app_name_environment)
        # Which path writes the bodies (LOGJAM_NATIVE); under `require` a missing build stops us here.
        native.announce(log, [ENCODER_MODULE])
        self.udp: _Datagrams | None = None

    async def start(self) -> None:
        if self.config.udp_listen:
            self.udp = _Datagrams(self)
            await self.udp.open(self.config.udp_listen)

    async def serve(self, conn: Connection) -> None:
        await (_RelpSession if self.config.relp else _Session)(self, conn).run()

    async def aclose(self) -> None:
        if self.udp is not None:
            await self.udp.close()


class _Session(PipelineSession[Any]):
    """One syslog stream (TCP or TLS): frames become messages; there is nothing to acknowledge."""

    version = "rfc6587"
    consequence = "closing the connection (plain syslog: those messages are lost)"

    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        host = bridge.host
        super().__init__(host, conn, self.make_engine(host.config.max_frame_size), name="syslog",
                         depth=host.config.pipeline_depth, consequence=self.consequence)
        self.bridge = bridge
        self.mapper = host.mapper
        self.metrics = host.metrics
        self.batch_size = host.config.batch_size
        self.batch: Batches = self.mapper.batches()
        self.plan: list[int] = []  # what the batch being built earns (RELP: its TXNRs)
        self.base = conn.metadata(self.version)

    def make_engine(self, max_frame: int) -> Any:
        return SyslogServer(max_frame)

    def accepted(self, plan: Any) -> None:
        """Plain syslog has no acks."""

    async def run(self) -> None:
        try:
            await self.read_loop()
            await self.flush()
            await self.pipeline.finish()
            self.answer()
            if self.failure is not None:
                raise self.failure
            self.goodbye()
            await self.conn.drain()
        finally:
            await self.pipeline.close()

    def goodbye(self) -> None:
        """What the session says before the host closes it: nothing, in plain syslog."""

    def answer(self) -> None:
        """Write the answers that wait for the end of this turn of the loop: none, in plain syslog."""

    async def on_events(self, events: list[Any]) -> None:
        for ev in events:
            if ev.__class__ is Frames:
                await self.add_run(ev.raws, {**self.base, "framing": ev.framing}, None)

    async def after_read(self) -> None:
        await self.flush()
        await self.conn.drain()

    async def add_run(self, raws: list[bytes], common: dict[str, Any], txnrs: list[int] | None) -> None:
        """Map a run of messages (their TXNRs in RELP), cut at --batch-size as one message at a
        time would be: each full batch is flushed before the next message is mapped."""
        received = self.base["received_at"]  # the connection's: 3164 years and created_ms
        i, n = 0, len(raws)
        while i < n:
            j = min(n, i + max(1, self.batch_size - self.batch.n))
            part = None if txnrs is None else txnrs[i:j]
            if part is not None:
                self.plan.extend(part)
            map_run(self.mapper, self.batch, raws[i:j] if i or j < n else raws, common, received,
                    self.bridge.app_env, part)
            i = j
            if self.batch.n >= self.batch_size:
                await self.flush()

    async def flush(self) -> None:
        if not self.batch:
            return
        batch, self.batch = self.batch, self.mapper.batches()
        plan, self.plan = self.plan, []
        n = len(batch)
        self.metrics.events_received.inc(n)
        pipeline = self.pipeline
        self.take(n)
        await pipeline.slot()
        if pipeline.failed:
            return
        pipeline.launch(plan, batches=batch, units=n, events=n)
        await pipeline.room()


class _RelpSession(_Session):
    """One RELP connection: `rsp 200 OK` for each `syslog` frame once the device accepted it,
    in the order the frames came (the pipeline settles batches in launch order)."""

    version = "relp"
    consequence = "closing without answering them (the RELP client sends them again)"

    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        super().__init__(bridge, conn)
        self.answers: list[bytes] = []  # rsp written at the end of this turn of the loop (`answer`)

    def make_engine(self, max_frame: int) -> Any:
        return RelpServer(max_frame)

    def waiting(self) -> bool:
        return self.engine.unanswered > 0

    def done(self) -> bool:
        return self.engine.closed

    def goodbye(self) -> None:
        # At shutdown, after the rsp of everything forwarded: librelp's hint that the server
        # goes away, so it reconnects (and resends what is unanswered) without waiting.
        self.answer()
        if self.conn.stopping and not self.engine.closed:
            self.conn.write(self.engine.send(ServerClose()))

    def accepted(self, plan: Any) -> None:
        if self.failure is not None:
            return
        engine = self.engine
        if isinstance(plan, tuple):  # ("open"|"close", txnr)
            kind, txnr = plan
            data = engine.send(Response(txnr, data=open_answer() if kind == "open" else b""))
        elif plan:
            data = engine.send_ok(plan)
        else:
            return
        # The rsp of every batch that settles in this turn of the loop go out in one write: a
        # send per batch was a quarter of RELP's CPU, and bigger answers let librelp send bigger runs.
        if not self.answers:
            asyncio.get_running_loop().call_soon(self.answer)
        self.answers.append(data)

    def answer(self) -> None:
        if self.answers:
            data, self.answers = b"".join(self.answers), []
            self.conn.write(data)

    async def on_events(self, events: list[Any]) -> None:
        for ev in events:
            if ev.__class__ is Syslogs:
                await self.add_run(ev.raws, self.base, ev.txnrs)
            elif ev.__class__ is Open:
                log.debug("%s: RELP open %s", self.conn.peer, ev.offers)
                self._in_line(("open", ev.txnr))
            elif ev.__class__ is Close:
                await self.flush()
                self._in_line(("close", ev.txnr))

    def _in_line(self, plan: tuple[str, int]) -> None:
        """An answer that waits only for the batches before it."""
        if not self.pipeline.failed:
            self.pipeline.launch(plan)


class _Datagrams:
    """Syslog over UDP: one message per datagram, gathered for UDP_GATHER_SECONDS (or up to
    UDP_FLUSH_EVENTS), mapped in runs when sent, forwarded without acks."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.host = bridge.host
        self.mapper = bridge.host.mapper
        # What waits to be sent, as columns: each datagram's message, sender and arrival.
        self.raws: list[bytes] = []
        self.peers: list[str] = []
        self.times: list[int] = []
        self.counted = 0  # how many of them logjam_bridge_events_received counts already
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None  # the flush to come
        self.tasks: set[asyncio.Task[int]] = set()
        self.listener: DatagramListener | None = None
        self.dropped = Counter("logjam_bridge_datagrams_dropped",
                               "Syslog datagrams dropped because the device link was full",
                               ["protocol"], registry=bridge.host.metrics.registry).labels("syslog")

    async def open(self, listen: str) -> None:
        host, port = split_listen(listen)
        self.listener = await listen_datagrams(host, port, self.received, datagram_reader())
        log.info("syslog datagrams (UDP) on %s:%d", host, port)

    def received(self, datas: list[bytes], peers: list[str]) -> None:
        """The datagrams one wakeup read (bridges/host/datagram.py), arrived now."""
        now = now_ms()
        raws = self.raws
        for data, peer in zip(datas, peers):
            raw = datagram_message(data)
            if not raw:
                continue
            if len(raws) >= UDP_FLUSH_EVENTS and self.full:
                self.dropped.inc()
                continue
            raws.append(raw)
            self.peers.append(peer)
            self.times.append(now)
            if len(raws) >= UDP_FLUSH_EVENTS:
                self.flush()
                raws = self.raws
        if raws and self.timer is None:
            # A wakeup reads what waits, often a datagram or two: sent at once, each would be a
            # batch of its own, which costs more than the rest of the datagram.
            self.timer = asyncio.get_running_loop().call_later(UDP_GATHER_SECONDS, self.flush)

    @property
    def full(self) -> bool:
        """As many batches are at the device as UDP may have there."""
        return len(self.tasks) >= UDP_MAX_BATCHES

    def _batch(self) -> Batches:
        """What gathered, mapped: a run of datagrams from one sender in one millisecond shares its @metadata."""
        raws, peers, times = self.raws, self.peers, self.times
        self.raws, self.peers, self.times = [], [], []
        self.counted = 0
        batch = self.mapper.batches()
        start, n = 0, len(raws)
        while start < n:
            peer, received = peers[start], times[start]
            end = start + 1
            while end < n and times[end] == received and peers[end] == peer:
                end += 1
            common = {"protocol": "syslog", "protocol_version": "rfc5426", "peer": peer, "received_at": received,
                      "framing": DATAGRAM}
            map_run(self.mapper, batch, raws[start:end] if start or end < n else raws, common, received,
                    self.bridge.app_env)
            start = end
        return batch

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # Counted here, not per datagram: a timer is set while any waits uncounted, so every
        # datagram is counted as received (or as dropped) within UDP_GATHER_SECONDS.
        fresh = len(self.raws) - self.counted
        if fresh:
            self.host.metrics.events_received.inc(fresh)
            self.counted += fresh
        # While the link is full, a burst gathers in one batch (and beyond it is dropped).
        if not self.raws or self.full:
            return
        batch = self._batch()
        n = len(batch)
        task = asyncio.ensure_future(forward(self.host, batch, "syslog udp"))
        self.tasks.add(task)

        def done(t: asyncio.Task[int]) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is None and t.result() == 0:
                self.host.metrics.events_acked.inc(n)
            if self.raws and self.timer is None:  # what gathered while the link was full
                self.timer = asyncio.get_running_loop().call_soon(self.flush)

        task.add_done_callback(done)

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        deadline = asyncio.get_running_loop().time() + 10
        self.flush()
        while self.tasks:  # a batch that waited for the link is sent as the others finish
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.wait(list(self.tasks), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            self.flush()


def map_run(mapper: EventMapper, out: Batches, raws: list[bytes], common: dict[str, Any], received_ms: int,
            app_env: AppEnv, txnrs: Sequence[int] | None = None) -> None:
    """Parse a run of messages and map them into `out`: for each, what `mapper.add` of its
    `parse`d body with `common` (then `txnr`, in RELP) as @metadata gives, byte for byte
    (tests/test_syslog_mapping.py checks it), but with the @metadata written from a template
    encoded once per run and the time taken from the parse instead of read again from the
    text. Runs of messages with the same app-env go to the mapper as one packed blob; with
    one app-env for all, the run is written by native/syslog.c where it can (encode.py)."""
    # The key numbers come from the mapper's one counter, so that every key of the process is
    # `<instance>:<n>` from one sequence, as `add` numbers them.
    key = mapper.take_keys(len(raws))
    meta = Metadata.of(common, mapper.instance, txnrs is not None)
    environment = app_env.environment
    if environment is None and (encoder := native_encoder()) is not None:
        blob, lens, stamps = encoder(raws, received_ms, meta, key, txnrs)
        mapper.add_encoded(out, blob, lens, stamps, app_env=app_env.default)
        return
    template, dumps = meta.template, orjson.dumps
    parts: list[bytes] = []
    lens, stamps = array("I"), array("q")
    env = app_env.default
    for i, raw in enumerate(raws):
        body, ms = parse_timed(raw, received_ms)
        if environment is not None:
            this = app_env(body)
            if this != env:
                if lens:
                    mapper.add_encoded(out, b"".join(parts), lens, stamps, app_env=env)
                    parts, lens, stamps = [], array("I"), array("q")
                env = this
        text = dumps(body)[:-1]  # a JSON object, whose closing brace the template writes
        meta_text = template % (key if txnrs is None else (txnrs[i], key))
        key += 1
        parts.append(text)
        parts.append(meta_text)
        lens.append(len(text) + len(meta_text))
        stamps.append(ms or received_ms)
    if lens:
        mapper.add_encoded(out, b"".join(parts), lens, stamps, app_env=env)
