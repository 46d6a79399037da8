"""`logjam-send`: a console producer for every protocol the mesh speaks, like kafka-console-producer.

Each line (from the arguments, or from stdin when there are none or one is `-`) becomes
one event: a line holding a JSON object is sent as that object, any other line as
{"message": line}. Lines are sent in batches; each batch must be acknowledged by the
peer within --timeout, else the command stops and exits 1. The protocol work happens
in the project's own client engines, driven by tools.send_clients.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence


from runtime import curve, lifecycle
from runtime.check import Checker
from runtime.config import add_config_flag, from_flags, parse_config
from runtime.curve import ClientCurve
from logjam import endpoints
from logjam.message import body_from_bytes
from tools.send_clients import DEFAULT_PORTS, SENDERS, Options, Sender, SendFailed, tls_context
from logjam.validation import is_valid_app_env

PROG = "logjam-send"
# A batch is flushed after this much quiet on stdin, so `tail -f | logjam-send` ships promptly.
STDIN_IDLE_S = 0.2
MAX_BATCH_BYTES = 1024 * 1024
# After SIGTERM, read at most this much more of what a writer already queued.
STOP_DRAIN_BYTES = 4 * 1024 * 1024
# RustLog's per-request limit.
MAX_BATCH_EVENTS = 1000

EPILOG = """\
acknowledgements:
  logjam      DEALER: each message is answered 202 Accepted (400 Bad Request fails the run).
              PUSH (--mode push): there is no acknowledgement; the command exits 0 once
              the messages are handed to ZeroMQ and the socket closed (with a linger of
              --timeout), even if no device is listening. Use DEALER to be sure.
  lumberjack  one window per batch; the ack of its last sequence number
  courier     the final ACKN of each payload (EVNT, or JDAT for servers without EVNT)
  segment     DataAppended for each append (a new writer id per run; the segment is
              created when missing)
  rustlog     ProduceResponse for each batch (the topic is created when missing)
  otlp        an OTLP/HTTP (protobuf) Export per batch answered 200 without refused records
  syslog      RELP (logjam-bridge syslog --relp): rsp 200 OK for each message, an RFC 5424
              line from APP-NAME logjam-send (MSG: the line, or the JSON object as text)

examples:
  logjam-send logjam 'hello' '{"message": "hi", "level": "warn"}'
  tail -f app.log | logjam-send lumberjack --to beats.example.com:5044 --tls-ca ca.pem
  logjam-send rustlog --rustlog-topic app-logs --dialect binary < events.jsonl
Empty lines are skipped; bytes that are not UTF-8 are replaced with U+FFFD. Lines from stdin
go out as they arrive (a batch closes after 0.2 s of quiet). SIGTERM stops reading stdin, sends
what was read, and exits as usual; Ctrl-C aborts (exit 130).
Exit status: 0 when everything was acknowledged, 1 when something was not, 2 for usage errors.
"""


class _Parser(argparse.ArgumentParser):
    """Messages may come before, between or after flags (`logjam-send courier a --to h:1 b`)."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        return self.parse_intermixed_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Send lines as events through one of the mesh's protocols and wait for the acknowledgement.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
    )
    p.add_argument("protocol", choices=sorted(SENDERS), help="protocol to speak")
    p.add_argument("messages", nargs="*", metavar="MESSAGE",
                   help="one event per argument; none, or '-', reads lines from stdin (use -- before messages starting with -)")
    p.add_argument("--to", metavar="HOST:PORT",
                   help="where to send (default 127.0.0.1 and the protocol's port: "
                        f"logjam {DEFAULT_PORTS['logjam']}, or {DEFAULT_PORTS['logjam-push']} with "
                        "--mode push, unless the mesh runs on this host: then device 0's ipc endpoint; "
                        f"lumberjack {DEFAULT_PORTS['lumberjack']}; courier {DEFAULT_PORTS['courier']}; "
                        f"segment {DEFAULT_PORTS['segment']}; rustlog {DEFAULT_PORTS['rustlog']}; "
                        f"otlp {DEFAULT_PORTS['otlp']}, OTLP/HTTP; syslog {DEFAULT_PORTS['syslog']}, RELP)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="wait this long for each connection and acknowledgement (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=500, metavar="N",
                   help=f"events per window/payload/append/request (at most {MAX_BATCH_EVENTS}; default %(default)s)")
    tls = p.add_argument_group("TLS (bridge protocols)")
    tls.add_argument("--tls", action="store_true", help="use TLS, verifying the server with the system's CAs")
    tls.add_argument("--tls-ca", metavar="FILE", help="verify the server against this CA (PEM); implies --tls")
    tls.add_argument("--tls-cert", metavar="FILE", help="client certificate for mutual TLS (PEM); implies --tls")
    tls.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    lj = p.add_argument_group("logjam")
    lj.add_argument("--mode", choices=["dealer", "push"], default="dealer",
                    help="dealer: acknowledged requests (default); push: fire and forget, cannot be acknowledged")
    lj.add_argument("--app-env", default="send-default", help="stream name, application-environment (default %(default)s)")
    lj.add_argument("--topic", default="logs.send", help="Logjam topic (default %(default)s)")
    lj.add_argument("--compress", choices=["none", "zlib", "snappy", "lz4"], default="none", help="body compression")
    lb = p.add_argument_group("lumberjack")
    lb.add_argument("--lumberjack-version", type=int, choices=[1, 2], default=2,
                    help="2: JSON frames (default); 1: string maps, nested values as JSON text")
    sg = p.add_argument_group("segment")
    sg.add_argument("--segment", default="logjam/send/0.#epoch.0", help="segment to append to (default %(default)s)")
    rl = p.add_argument_group("rustlog")
    rl.add_argument("--rustlog-topic", default="logjam-send", help="topic to produce to (default %(default)s)")
    rl.add_argument("--partition", type=int, default=0, help="partition (default %(default)s)")
    rl.add_argument("--dialect", choices=["json", "binary"], default="json", help="wire dialect (default %(default)s)")
    ot = p.add_argument_group("otlp")
    ot.add_argument("--service", metavar="NAME", help="the resource's service.name (none: the bridge's --app-env)")
    ot.add_argument("--environment", metavar="ENV", help="the resource's deployment.environment.name")
    curve.add_client_flags(p)
    add_config_flag(p)
    return p


@dataclass(frozen=True, slots=True)
class SendConfig:
    """The flags of one logjam-send run, as given (`validated` turns them into the client `Options`)."""

    protocol: str
    messages: tuple[str, ...]
    to: str | None
    timeout: float
    batch_size: int
    tls: bool
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    mode: str
    app_env: str
    topic: str
    compress: str
    lumberjack_version: int
    segment: str
    rustlog_topic: str
    partition: int
    dialect: str
    service: str | None
    environment: str | None
    curve: ClientCurve  # --keys, --curve-secret, --curve-server-key, --plaintext

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "SendConfig":
        return from_flags(cls, args, messages=tuple(args.messages), curve=ClientCurve.from_flags(args))


def parse_target(to: str | None, default_port: int) -> tuple[str, int]:
    if not to:
        return "127.0.0.1", default_port
    host, sep, port = to.rpartition(":")
    if not sep:
        host, port = to, str(default_port)
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--to {to!r}: expected HOST:PORT")
    return host, int(port)


def event_of(line: str) -> dict[str, Any]:
    """A JSON object line is the event itself; any other line is its message (as every bridge maps bytes)."""
    return body_from_bytes(line.encode())


def _decode(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", "replace")


def stdin_lines(fd: int, stop: threading.Event | None = None) -> Iterator[str | None]:
    """Lines of `fd` as they arrive; None marks a pause (nothing more to read for a moment).

    Setting `stop` (SIGTERM) ends the input as EOF would, once what is already waiting in
    the pipe (up to STOP_DRAIN_BYTES) has been read, so it still goes out.
    """
    pending = b""
    drained = 0
    while True:
        stopping = stop is not None and stop.is_set()
        try:
            ready, _, _ = select.select([fd], [], [], 0 if stopping else STDIN_IDLE_S)
        except (OSError, ValueError):  # not selectable (e.g. some Windows handles): just read
            ready = [fd]
        if not ready:
            if stopping:
                break
            yield None
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            yield _decode(raw)
        if stopping:
            drained += len(chunk)
            if drained >= STOP_DRAIN_BYTES:
                break
    if pending:
        yield _decode(pending)


def lines_of(messages: Sequence[str], stdin_fd: int, stop: threading.Event | None = None) -> Iterator[str | None]:
    if not messages:
        messages = ["-"]
    for m in messages:
        if m == "-":
            yield from stdin_lines(stdin_fd, stop)
        else:
            yield from m.split("\n")


def batches(lines: Iterator[str | None], size: int) -> Iterator[list[dict[str, Any]]]:
    """Groups of at most `size` events (and about MAX_BATCH_BYTES); a pause on stdin ends a group early."""
    batch: list[dict[str, Any]] = []
    nbytes = 0
    for line in lines:
        if line is None:
            if batch:
                yield batch
                batch, nbytes = [], 0
            continue
        if not line.strip():
            continue
        batch.append(event_of(line))
        nbytes += len(line)
        if len(batch) >= size or nbytes >= MAX_BATCH_BYTES:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def options(config: SendConfig) -> Options:
    key = "logjam-push" if config.protocol == "logjam" and config.mode == "push" else config.protocol
    host, port = parse_target(config.to, DEFAULT_PORTS[key])
    tls: ssl.SSLContext | None = None
    if config.protocol == "logjam" and (config.tls or config.tls_ca or config.tls_cert or config.tls_key):
        raise ValueError("the logjam protocol runs on ZeroMQ without TLS; the --tls flags are for the bridge protocols")
    if config.tls_key and not config.tls_cert:
        raise ValueError("--tls-key needs --tls-cert")
    if config.tls or config.tls_ca or config.tls_cert:
        try:
            tls = tls_context(config.tls_ca, config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"cannot load TLS files: {e}") from None
    # The logjam protocol goes to the device itself: on the mesh's host without --to, to device 0's
    # ipc endpoint (no CURVE); else over TCP with CURVE, with the mesh's client key by default.
    local = endpoints.local_devices("router" if config.mode == "dealer" else "pull") \
        if config.protocol == "logjam" and not config.to else []
    key = config.curve.load() if config.protocol == "logjam" and not local else None
    return Options(
        host=host, port=port, timeout=config.timeout, tls=tls, curve=key, mode=config.mode,
        endpoint=local[0] if local else None,
        app_env=config.app_env, topic=config.topic, compress=config.compress,
        lumberjack_version=config.lumberjack_version, segment=config.segment, rustlog_topic=config.rustlog_topic,
        partition=config.partition, dialect=config.dialect, service=config.service, environment=config.environment,
    )


def validated(config: SendConfig) -> Options:
    """The options of a send, or ValueError saying which flag is wrong (or which key file is missing)."""
    if config.timeout <= 0:
        raise ValueError("--timeout must be positive")
    if not 1 <= config.batch_size <= MAX_BATCH_EVENTS:
        raise ValueError(f"--batch-size must be within 1..{MAX_BATCH_EVENTS}")
    return options(config)


def check(config: SendConfig) -> int:
    """--check: the flags, the target, the TLS files; stdin is not read."""
    c = Checker(PROG)
    for flag, path in (("--tls-ca", config.tls_ca), ("--tls-cert", config.tls_cert), ("--tls-key", config.tls_key)):
        c.readable_file(flag, path)
    if config.protocol == "logjam" and not is_valid_app_env(config.app_env):
        c.error(f"--app-env {config.app_env!r} is not application-environment; the device would refuse it")
    opts = c.attempt("flags and TLS files", lambda: validated(config))
    if opts is not None:
        given = config.messages and config.messages != ("-",)
        what = f"{len(config.messages)} message argument(s)" if given else "stdin lines"
        secured = " with TLS" if opts.tls else " with CURVE" if opts.curve else ""
        c.would_run(f"send {what} as {config.protocol} to {opts.where}{secured}, "
                    f"{config.batch_size} per batch, waiting {config.timeout:g}s for each acknowledgement")
    return c.report()


def run(config: SendConfig, stdin_fd: int) -> int:
    try:
        if config.protocol == "logjam" and not is_valid_app_env(config.app_env):
            print(f"{PROG}: warning: --app-env {config.app_env!r} is not application-environment; "
                  "the device will refuse it", file=sys.stderr)
        opts = validated(config)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    # SIGTERM: stop reading, send and wait for what was read, exit 0 (Ctrl-C aborts).
    stop = lifecycle.stop_event((signal.SIGTERM,))
    started = time.monotonic()
    sent = acked = 0
    sender: Sender | None = None
    push = config.protocol == "logjam" and config.mode == "push"
    what = f"{config.protocol} {opts.where}" + (" (PUSH)" if push else "")
    try:
        for batch in batches(lines_of(config.messages, stdin_fd, stop), config.batch_size):
            sent += len(batch)
            if sender is None:
                sender = SENDERS[config.protocol](opts)
            sender.send(batch)
            acked += len(batch)
    except SendFailed as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        print(f"{PROG}: {acked} of {sent} events acknowledged by {what}; the rest may not have arrived", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; {acked} of {sent} events acknowledged by {what}", file=sys.stderr)
        return 130
    finally:
        if sender is not None:
            sender.close()
    elapsed = time.monotonic() - started
    if sender is not None and not sender.acknowledged:
        print(f"{PROG}: {_events(sent)} sent to {what} in {elapsed:.2f} s (PUSH: not acknowledged)", file=sys.stderr)
    else:
        print(f"{PROG}: {_events(acked)} sent to {what} and acknowledged in {elapsed:.2f} s", file=sys.stderr)
    return 0


def _events(n: int) -> str:
    return f"{n} event" if n == 1 else f"{n} events"


def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_config(build_parser(), argv, SendConfig.from_flags)
    if args.check:
        return check(config)
    return run(config, sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main())
