"""Blocking adapters behind `logjam-send`: one small sender per protocol.

Each sender drives the project's own sans-IO client half of its protocol (the bytes
are built and parsed there) over a plain or TLS socket, and `send(batch)` returns
only when the peer acknowledged the whole batch, raising `SendFailed` otherwise.
This module is the only place where `logjam-send`'s bytes meet sockets.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import orjson
import zmq

from bridges.courier.engine import CourierClient
from bridges.courier.messages import AckReceived, UnknownReceived, VersionReceived
from bridges.lumberjack.engine import V1, V2, LumberjackClient
from bridges.otlp import engine as otlp
from bridges.rustlog import engine as rl
from bridges.segment import engine as seg
from bridges.syslog.relp import RelpClient, Response
from logjam import defaults
from logjam.curve import ClientKey
from logjam.errors import ProtocolError
from logjam.producer import Producer, ReplyTimeout

Event = dict[str, Any]
T = TypeVar("T")

DEFAULT_PORTS = {
    "logjam": defaults.ROUTER_PORT,
    "logjam-push": defaults.PULL_PORT,
    **{name: defaults.BRIDGE_PORTS[name] for name in ("lumberjack", "courier", "segment", "rustlog", "otlp")},
    "syslog": defaults.BRIDGE_PORTS["relp"],  # RELP: the syslog transport that acknowledges
}


class SendFailed(Exception):
    """Something was not acknowledged in time, or the peer refused it."""


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    timeout: float
    tls: ssl.SSLContext | None = None
    # logjam
    curve: ClientKey | None = None  # None: plaintext (--plaintext, or an ipc endpoint)
    endpoint: str | None = None  # the device's ipc endpoint on the mesh's host, instead of host:port
    mode: str = "dealer"
    app_env: str = "send-default"
    topic: str = "logs.send"
    compress: str = "none"
    # lumberjack
    lumberjack_version: int = 2
    # segment
    segment: str = "logjam/send/0.#epoch.0"
    # rustlog
    rustlog_topic: str = "logjam-send"
    partition: int = 0
    dialect: str = "json"
    # otlp: the resource's service.name and deployment.environment.name (none: the bridge's --app-env)
    service: str | None = None
    environment: str | None = None

    @property
    def where(self) -> str:
        return self.endpoint or f"{self.host}:{self.port}"


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """Verify the server against `ca` (or the system's CAs); present `cert`/`key` for mutual TLS."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def events_json(batch: Iterable[Event]) -> list[bytes]:
    return [orjson.dumps(e) for e in batch]


class _Stream:
    """A TCP (or TLS) connection read against a deadline."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        try:
            sock = socket.create_connection((opts.host, opts.port), timeout=opts.timeout)
        except OSError as e:
            raise SendFailed(f"cannot connect to {opts.where}: {e.strerror or e}") from None
        if opts.tls is not None:
            try:
                sock = opts.tls.wrap_socket(sock, server_hostname=opts.host)
            except (ssl.SSLError, OSError) as e:
                sock.close()
                raise SendFailed(f"TLS handshake with {opts.where} failed: {e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.received = 0

    def write(self, data: bytes) -> None:
        self.sock.settimeout(self.opts.timeout)
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise SendFailed(f"{self.opts.where} closed the connection while we were sending: {e}") from None

    def until(self, feed: Callable[[bytes], Iterable[T]], done: Callable[[T], bool], what: str) -> T:
        """Read and `feed` until an event satisfies `done` (returned); fail at the deadline."""
        deadline = time.monotonic() + self.opts.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SendFailed(f"no {what} from {self.opts.where} within {self.opts.timeout:g} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, socket.timeout):
                continue
            except OSError as e:
                raise SendFailed(f"{self.opts.where} broke the connection before the {what}: {e}") from None
            if not data:
                hint = ""
                if self.opts.tls is not None and not self.received:
                    # TLS 1.3 finishes the client's handshake before the server checks our certificate.
                    hint = " (a TLS server that wants a client certificate, or refuses ours, closes like this: see --tls-cert/--tls-key)"
                raise SendFailed(f"{self.opts.where} closed the connection before the {what}{hint}")
            self.received += len(data)
            try:
                for event in feed(data):
                    if done(event):
                        return event
            except ProtocolError as e:
                raise SendFailed(f"{self.opts.where} answered something unreadable: {e}") from None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Sender:
    """What `logjam-send` needs from every protocol."""

    acknowledged: bool = True

    def send(self, batch: list[Event]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ logjam (ZeroMQ)


class LogjamSender(Sender):
    """DEALER: every message is a request answered 202 or 400. PUSH: fire and forget."""

    def __init__(self, opts: Options) -> None:
        if opts.tls is not None:
            raise SendFailed("the logjam protocol runs on ZeroMQ without TLS; --tls-* flags apply to the bridges")
        self.opts = opts
        self.ctx = zmq.Context()
        self.acknowledged = opts.mode == "dealer"
        # DEALER only closes after every reply came back; PUSH must linger to deliver.
        linger = 0 if self.acknowledged else int(opts.timeout * 1000)
        self.producer = Producer(
            opts.endpoint or f"tcp://{opts.host}:{opts.port}", mode=opts.mode, compression=opts.compress,
            timeout=opts.timeout, context=self.ctx, linger_ms=linger, curve=opts.curve,
        )
        self.failed = False

    def send(self, batch: list[Event]) -> None:
        p, o = self.producer, self.opts
        if not self.acknowledged:
            for event in batch:
                p.send(o.app_env, o.topic, event)
            return
        for event in batch:
            p.submit(o.app_env, o.topic, event)
        try:
            result = p.flush()
        except ReplyTimeout:
            self.failed = True
            raise SendFailed(
                f"{p.outstanding} of {len(batch)} messages got no reply from the device at {o.where} "
                f"within {o.timeout:g} s (is logjam-device running there?)"
            ) from None
        if result.rejected:
            raise SendFailed(
                f"the device refused {result.rejected} of {len(batch)} messages with 400 Bad Request "
                f"(check --app-env {o.app_env!r} and --topic {o.topic!r})"
            )

    def close(self) -> None:
        # Producer.close() pings first; a device that never answered will not answer that either.
        self.producer.close(ping=not self.failed)
        self.ctx.term()  # honours LINGER: PUSH messages still queued get this long to leave


# ------------------------------------------------------------------ lumberjack


def _string_map(event: Event) -> dict[str, str]:
    """v1 carries strings only: nested values travel as their JSON text."""
    return {k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in event.items()}


class LumberjackSender(Sender):
    """One window per batch; the ack of the window's last sequence number covers it."""

    def __init__(self, opts: Options) -> None:
        if opts.lumberjack_version not in (1, 2):
            raise SendFailed(f"--lumberjack-version must be 1 or 2, not {opts.lumberjack_version}")
        self.client = LumberjackClient(version=V1 if opts.lumberjack_version == 1 else V2)
        self.stream = _Stream(opts)

    def send(self, batch: list[Event]) -> None:
        events: list[Any] = [_string_map(e) for e in batch] if self.client.version == V1 else events_json(batch)
        self.stream.write(self.client.send(events))
        last = self.client.last_seq
        self.stream.until(self.client.feed, lambda ack: ack.seq == last, f"ack for sequence {last}")

    def close(self) -> None:
        self.stream.close()


# ------------------------------------------------------------------ courier


class CourierSender(Sender):
    """HELO/VERS, then one EVNT (or JDAT, if the server did not offer EVNT) per batch."""

    def __init__(self, opts: Options) -> None:
        self.client = CourierClient()
        self.stream = _Stream(opts)
        self.stream.write(self.client.hello())
        vers = self.stream.until(self.client.feed, lambda ev: isinstance(ev, (VersionReceived, UnknownReceived)), "VERS")
        if isinstance(vers, UnknownReceived):
            raise SendFailed(f"{opts.where} does not understand HELO; is it a Courier server?")
        self.evnt = vers.handshake.supports_evnt

    def send(self, batch: list[Event]) -> None:
        nonce = os.urandom(16)
        records = events_json(batch)
        self.stream.write(self.client.evnt(nonce, records) if self.evnt else self.client.jdat(nonce, records))

        def final(ev: Any) -> bool:
            if isinstance(ev, UnknownReceived):
                raise SendFailed(f"{self.stream.opts.where} answered ???? to our payload")
            return isinstance(ev, AckReceived) and ev.nonce == nonce and ev.sequence >= len(records)

        self.stream.until(self.client.feed, final, f"final ACKN for {len(records)} events")

    def close(self) -> None:
        self.stream.close()


# ------------------------------------------------------------------ segment (Pravega wire protocol)


_SEGMENT_REFUSALS = (
    seg.NoSuchSegment, seg.SegmentIsSealed, seg.InvalidEventNumber, seg.ErrorMessage, seg.WrongHost,
    seg.OperationUnsupported, seg.ConditionalCheckFailed, seg.SegmentAlreadyExists,
)


class SegmentSender(Sender):
    """Hello, SetupAppend under a fresh writer id (creating the segment if needed), one append per batch."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.client = seg.SegmentClient()
        self.stream = _Stream(opts)
        self.writer = uuid.uuid4()
        self.request_id = 0
        self.stream.write(self.client.send(seg.Hello()))
        hello = self._reply(lambda r: isinstance(r, seg.Hello), "Hello")
        if not hello.compatible():
            raise SendFailed(f"{opts.where} speaks wire versions {hello.low_version}..{hello.high_version}, we speak {seg.WIRE_VERSION}")
        setup = self._setup()
        if isinstance(setup, seg.NoSuchSegment):
            self.stream.write(self.client.send(seg.CreateSegment(self._next_id(), opts.segment)))
            created = self._reply(lambda r: not isinstance(r, seg.KeepAlive), "SegmentCreated")
            if not isinstance(created, (seg.SegmentCreated, seg.SegmentAlreadyExists)):
                raise SendFailed(f"{opts.where} could not create segment {opts.segment!r}: {_describe(created)}")
            setup = self._setup()
        if not isinstance(setup, seg.AppendSetup):
            raise SendFailed(f"{opts.where} refused SetupAppend on {opts.segment!r}: {_describe(setup)}")
        self.event_number = max(setup.last_event_number, 0)

    def _next_id(self) -> int:
        self.request_id += 1
        return self.request_id

    def _reply(self, done: Callable[[Any], bool], what: str) -> Any:
        return self.stream.until(self.client.feed, done, what)

    def _setup(self) -> Any:
        self.stream.write(self.client.send(seg.SetupAppend(self._next_id(), self.writer, self.opts.segment)))
        return self._reply(lambda r: isinstance(r, (seg.AppendSetup, *_SEGMENT_REFUSALS)), "AppendSetup")

    def send(self, batch: list[Event]) -> None:
        last = self.event_number + len(batch)
        self.stream.write(self.client.append(self.writer, events_json(batch), last, self._next_id()))

        def acked(r: Any) -> bool:
            if isinstance(r, _SEGMENT_REFUSALS):
                raise SendFailed(f"{self.opts.where} refused the append: {_describe(r)}")
            return isinstance(r, seg.DataAppended) and r.writer_id == self.writer and r.event_number >= last

        self._reply(acked, f"DataAppended for event {last}")
        self.event_number = last

    def close(self) -> None:
        self.stream.close()


def _describe(reply: Any) -> str:
    text = getattr(reply, "message", "") or getattr(reply, "operation", "")
    return f"{type(reply).__name__}" + (f" ({text})" if text else "")


# ------------------------------------------------------------------ rustlog


class RustlogSender(Sender):
    """Creates the topic if it is missing, then one Produce per batch."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.dialect = rl.Dialect(opts.dialect)
        self.client = rl.RustlogClient()
        self.stream = _Stream(opts)
        described = self._call(rl.DescribeTopic(opts.rustlog_topic, self.dialect), "DescribeTopicResponse")
        if isinstance(described, rl.ErrorReply):
            if described.code != rl.ErrorKind.DESCRIBE_TOPIC_NOT_FOUND.code(self.dialect):
                raise SendFailed(f"{opts.where} refused DescribeTopic {opts.rustlog_topic!r}: {_error(described)}")
            created = self._call(rl.CreateTopic(opts.rustlog_topic, opts.partition + 1, self.dialect), "CreateTopicResponse")
            if isinstance(created, rl.ErrorReply):
                raise SendFailed(f"{opts.where} could not create topic {opts.rustlog_topic!r}: {_error(created)}")

    def _call(self, request: Any, what: str) -> Any:
        try:
            self.stream.write(self.client.send(request))
        except ProtocolError as e:
            raise SendFailed(f"cannot encode {type(request).__name__}: {e}") from None
        return self.stream.until(self.client.feed, lambda r: True, what)

    def send(self, batch: list[Event]) -> None:
        o = self.opts
        reply = self._call(rl.Produce(o.rustlog_topic, o.partition, tuple(events_json(batch)), self.dialect), "ProduceResponse")
        if isinstance(reply, rl.ErrorReply):
            raise SendFailed(f"{o.where} refused the Produce to {o.rustlog_topic}/{o.partition}: {_error(reply)}")
        if not isinstance(reply, rl.ProduceResponse) or reply.record_count != len(batch):
            raise SendFailed(f"{o.where} answered the Produce of {len(batch)} records with {reply!r}")

    def close(self) -> None:
        self.stream.close()


# ------------------------------------------------------------------ syslog (RELP)


def syslog_line(event: Event) -> bytes:
    """One RFC 5424 message: user.notice from APP-NAME logjam-send, MSG the event's `message`
    when it is text, else the event as JSON."""
    message = event.get("message")
    text = message if isinstance(message, str) and len(event) == 1 else orjson.dumps(event).decode()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    return f"<13>1 {stamp} {socket.gethostname() or '-'} logjam-send {os.getpid()} - - {text}".encode()


class SyslogSender(Sender):
    """RELP (rsyslog's acknowledged transport): open, one `syslog` frame per event, and every
    frame's `rsp 200 OK`, which the bridge sends once the device accepted the message."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.client = RelpClient()
        self.stream = _Stream(opts)
        self.stream.write(self.client.send("open"))
        opened = self.stream.until(self.client.feed, lambda r: isinstance(r, Response), "answer to RELP open")
        if opened.code != 200:
            raise SendFailed(f"{opts.where} refused the RELP session: {opened.code} {opened.text}")

    def send(self, batch: list[Event]) -> None:
        client = self.client
        self.stream.write(b"".join(client.send("syslog", syslog_line(e)) for e in batch))
        refused: list[Response] = []

        def feed(data: bytes) -> list[Any]:
            answers = client.feed(data)
            refused.extend(r for r in answers if isinstance(r, Response) and r.code != 200)
            return answers

        # One read may carry many rsp: done once none is outstanding.
        self.stream.until(feed, lambda _: client.unanswered == 0, f"RELP rsp for {len(batch)} messages")
        if refused:
            raise SendFailed(f"{self.opts.where} answered {len(refused)} RELP frames with {refused[0].code} {refused[0].text}")

    def close(self) -> None:
        try:
            self.stream.write(self.client.send("close"))
            self.stream.until(self.client.feed, lambda r: isinstance(r, Response), "answer to RELP close")
        except SendFailed:
            pass  # everything was acknowledged already; the close is a courtesy
        self.stream.close()


def _error(reply: rl.ErrorReply) -> str:
    return f"error {reply.code}: {reply.message}"


class OtlpSender(Sender):
    """One OTLP/HTTP protobuf request (`POST /v1/logs`) per batch, on one keep-alive connection;
    success, or a partial success with nothing refused, is the acknowledgement."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.resource = {k: v for k, v in (("service.name", opts.service),
                                          ("deployment.environment.name", opts.environment)) if v}
        self.client = otlp.OtlpClient(opts.host)
        self.stream = _Stream(opts)

    def send(self, batch: list[Event]) -> None:
        o = self.opts
        try:
            self.stream.write(self.client.send(otlp.client_request(batch, self.resource, time.time_ns())))
        except ProtocolError as e:
            raise SendFailed(f"cannot send the OTLP request: {e}") from None
        reply = self.stream.until(self.client.feed, lambda r: True, "OTLP/HTTP response")
        if reply.status != 200:
            retry = reply.headers.get("retry-after")
            raise SendFailed(f"{o.where} answered HTTP {reply.status}" + (f" (retry after {retry} s)" if retry else ""))
        try:
            partial = otlp.client_reply(reply.body).partial_success
        except ProtocolError as e:
            raise SendFailed(f"{o.where} answered something unreadable: {e}") from None
        if partial.rejected_log_records:
            raise SendFailed(f"{o.where} refused {partial.rejected_log_records} of {len(batch)} records: "
                             f"{partial.error_message}")

    def close(self) -> None:
        self.stream.close()


SENDERS: dict[str, Callable[[Options], Sender]] = {
    "logjam": LogjamSender,
    "lumberjack": LumberjackSender,
    "courier": CourierSender,
    "segment": SegmentSender,
    "rustlog": RustlogSender,
    "otlp": OtlpSender,
    "syslog": SyslogSender,
}
