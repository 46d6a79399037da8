"""`logjam-tail`: watch live traffic on one or more device PUB sockets, like `tail -f`.

This is the process entry point: flags and TOML, the SUB loop, stop on SIGTERM or
Ctrl-C, and writing to stdout. Formatting lives in `tools.tail_render` and the
--stats tables in `tools.tail_stats`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence

import zmq
from rich.color import ColorSystem
from rich.console import Console
from rich.live import Live

from logjam import defaults, endpoints, sockets
from logjam.curve import ClientKey
from runtime import curve, lifecycle
from runtime.check import Checker
from runtime.config import add_config_flag, parse_config, setup_logging
from runtime.curve import ClientCurve
from logjam.message import Message
from logjam.subscriber import Gap, Subscriber
from tools.tail_render import Palette, Renderer
from tools.tail_stats import StatsBoard

DEFAULT_SUB = defaults.device_endpoint("pub")
MODES = ("lines", "json", "pretty", "raw", "stats")
POLL_S = 0.2
WARN_EVERY_S = 5.0

log = logging.getLogger("logjam-tail")

DESCRIPTION = "Watch live Logjam traffic on device PUB sockets."
EPILOG = """\
gaps:
  Lost messages are shown inline as '-- device N: K messages lost (seq A..B)'.
  A device numbers all its streams with one counter, so gaps can only be found
  when subscribed to every stream. With --app-env the subscription is a prefix,
  other streams' numbers look like holes, and gap detection is OFF. --topic is
  filtered here after receiving, so it keeps gap detection on.

output:
  Lines are coloured and cut to the terminal width on a TTY, plain and whole
  when piped. Control characters in messages are always escaped. Bodies that
  fail to decompress or decode are shown with '!! bad body' and tailing goes on.

config:
  --config FILE reads TOML whose keys are the long flag names, e.g.
  sub = ["tcp://dev1:9606"], app-env = ["shop-"], mode = "json", count = 10.
  Flags given on the command line win.
"""


class _Repeatable(argparse.Action):
    """Like action="append", but the first use on the command line replaces a TOML default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._namespace_id: int | None = None

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self._namespace_id != id(namespace):
            self._namespace_id = id(namespace)
            setattr(namespace, self.dest, [])
        getattr(namespace, self.dest).append(values)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-tail", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--sub", action=_Repeatable, metavar="ENDPOINT",
                   help="device PUB endpoint; repeatable (default: on the mesh's host, every device it runs, "
                        f"through their ipc endpoints under $LOGJAM_DATA_DIR or ./data; else {DEFAULT_SUB})")
    p.add_argument("--app-env", action=_Repeatable, metavar="PREFIX",
                   help="subscribe only to app-envs starting with PREFIX (a ZeroMQ subscription); "
                        "repeatable. Turns gap detection off, see below")
    p.add_argument("--topic", action=_Repeatable, metavar="PREFIX",
                   help="show only topics starting with PREFIX; repeatable")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--json", dest="mode", action="store_const", const="json",
                      help="one JSON object per line: app_env, topic, device, seq, created_ms, "
                           "compression, body (parsed JSON, or a string); gaps as {\"gap\": {...}}")
    mode.add_argument("--pretty", dest="mode", action="store_const", const="pretty",
                      help="a header line per message, then the body as indented JSON")
    mode.add_argument("--raw", dest="mode", action="store_const", const="raw",
                      help="the body bytes as received, before decompression, with \\xNN escapes")
    mode.add_argument("--stats", dest="mode", action="store_const", const="stats",
                      help="instead of messages, a live table of messages/s and bytes/s per "
                           "app-env and topic, and gaps per device")
    p.set_defaults(mode="lines")
    p.add_argument("--count", type=_positive_int, metavar="N",
                   help="exit 0 after N messages (heartbeats count when shown)")
    p.add_argument("--heartbeats", action="store_true", help="also show the devices' heartbeats")
    p.add_argument("--width", type=int, metavar="COLS",
                   help="cut lines to COLS cells (default: the terminal width on a TTY, "
                        "no limit when piped; 0 means no limit)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour output (default auto: only on a TTY, and not with NO_COLOR)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="--stats refresh interval (default 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    curve.add_client_flags(p)
    add_config_flag(p)
    return p


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


@dataclass(frozen=True, slots=True)
class TailConfig:
    """What logjam-tail shows, built once from flags and TOML."""

    sub: tuple[str, ...]
    app_env: tuple[str, ...]  # ZeroMQ subscription prefixes; empty: every app-env
    topic: tuple[str, ...]  # topic prefixes, filtered after receipt
    mode: str
    count: int | None
    heartbeats: bool
    width: int | None
    color: str
    interval: float
    verbose: bool
    curve: ClientCurve  # --keys, --curve-secret, --curve-server-key, --plaintext

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "TailConfig":
        """The config of these flags, or ValueError (TOML values bypass argparse's type checks)."""
        # On the mesh's host: every device `make up` runs, over ipc; elsewhere device 0 over TCP.
        sub = tuple(_as_list(args.sub)) or tuple(endpoints.local_devices("pub")) or (DEFAULT_SUB,)
        if args.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {args.mode!r}")
        if args.count is not None and (not isinstance(args.count, int) or args.count <= 0):
            raise ValueError(f"count must be a positive integer, not {args.count!r}")
        if args.width is not None and (not isinstance(args.width, int) or args.width < 0):
            raise ValueError(f"width must be 0 or more, not {args.width!r}")
        if not isinstance(args.interval, (int, float)) or args.interval <= 0:
            raise ValueError(f"interval must be positive, not {args.interval!r}")
        for ep in sub:
            if "://" not in ep:
                raise ValueError(f"--sub {ep!r}: expected an endpoint such as {DEFAULT_SUB}")
        return cls(sub=sub, app_env=tuple(_as_list(args.app_env)), topic=tuple(_as_list(args.topic)), mode=args.mode,
                   count=args.count, heartbeats=args.heartbeats, width=args.width, color=args.color,
                   interval=args.interval, verbose=args.verbose, curve=ClientCurve.from_flags(args))


def check(config: TailConfig) -> int:
    """--check: everything was validated while parsing; say what would be shown, and read the key files."""
    c = Checker("logjam-tail")
    c.ok(f"--sub {', '.join(config.sub)}")
    streams = f"app-envs starting with {', '.join(config.app_env)}" if config.app_env else "every app-env"
    topics = f", topics starting with {', '.join(config.topic)}" if config.topic else ""
    c.would_run(f"subscribe to {', '.join(config.sub)}: {streams}{topics}, shown as {config.mode}"
                + (f", stop after {config.count}" if config.count else ""))
    config.curve.check(c, config.sub)
    return c.report()


def _console(config: TailConfig) -> Console:
    force = {"always": True, "never": False}.get(config.color)
    return Console(file=sys.stdout, force_terminal=force, no_color=config.color == "never" or None,
                   highlight=False, soft_wrap=False)


def _palette(config: TailConfig, console: Console) -> Palette:
    if not console.is_terminal or console.no_color:
        return Palette(None)
    if config.color == "always":
        return Palette(console.color_system or ColorSystem.STANDARD)
    return Palette(console.color_system)


class _Tail:
    """The SUB loop shared by every mode."""

    def __init__(self, config: TailConfig, sub: Subscriber, stop: Any) -> None:
        self.config = config
        self.sub = sub
        self.stop = stop
        self.topics = config.topic
        self.shown = 0
        self._warned_bad = 0
        self._warned_at = 0.0

    def wanted(self, msg: Message) -> bool:
        if msg.is_heartbeat:
            return self.config.heartbeats
        return not self.topics or msg.topic.startswith(self.topics)

    def done(self) -> bool:
        return self.config.count is not None and self.shown >= self.config.count

    def warn_undecodable(self) -> None:
        bad = self.sub.bad_messages
        now = time.monotonic()
        if bad > self._warned_bad and now - self._warned_at >= WARN_EVERY_S:
            log.warning("skipped %d undecodable messages (bad meta or frame count; -v shows why)",
                        bad - self._warned_bad)
            self._warned_bad, self._warned_at = bad, now

    def run_lines(self, renderer: Renderer, console: Console) -> None:
        out = sys.stdout.buffer
        # Only a real terminal has a width; FORCE_COLOR on a pipe must not cut lines.
        auto_width = self.config.width is None and sys.stdout.isatty()
        while not self.stop.is_set() and not self.done():
            batch = self.sub.recv_batch(timeout=POLL_S)
            if auto_width:
                renderer.width = console.size.width
            chunks: list[str] = []
            for item in batch:
                if isinstance(item, Gap):
                    chunks.append(renderer.gap(item))
                elif self.wanted(item):
                    chunks.append(renderer.message(item))
                    self.shown += 1
                    if self.done():
                        break
            if chunks:
                out.write("".join(chunks).encode("utf-8", "replace"))
                out.flush()
            self.warn_undecodable()

    def run_stats(self, console: Console) -> None:
        board = StatsBoard(self.config.sub, self.config.app_env, self.config.topic)

        def render() -> Any:
            return board.render(self.sub.gaps, self.sub.bad_messages, self.sub.reconnects)

        def pump(until: float) -> None:
            while not self.stop.is_set() and not self.done():
                wait = until - time.monotonic()
                if wait <= 0:
                    return
                for item in self.sub.recv_batch(timeout=min(wait, POLL_S)):
                    if isinstance(item, Message):
                        counted = self.wanted(item)
                        board.observe(item, counted)
                        if counted:
                            self.shown += 1
                            if self.done():
                                return

        if console.is_interactive:
            with Live(render(), console=console, auto_refresh=False, transient=False) as live:
                while not self.stop.is_set() and not self.done():
                    pump(time.monotonic() + self.config.interval)
                    live.update(render(), refresh=True)
        else:
            # A pipe cannot redraw, so print one table per interval, and a last one on exit.
            while not self.stop.is_set() and not self.done():
                pump(time.monotonic() + self.config.interval)
                console.print(render())
                console.file.flush()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, config = parse_config(parser, argv, TailConfig.from_flags)
        if args.check:
            return check(config)
        setup_logging("logjam-tail", config.verbose)
        try:
            key = config.curve.load(config.sub)
        except curve.KeyFileError as e:
            parser.error(str(e))
        stop = lifecycle.stop_event()
        return _run(config, key, stop, parser.error)
    except KeyboardInterrupt:
        # Only reachable before the signal handlers are installed.
        return 0
    except BrokenPipeError:
        # `logjam-tail | head`: the reader is gone, which is not an error for us.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _run(config: TailConfig, key: ClientKey | None, stop: Any, error: Callable[[str], NoReturn]) -> int:
    """`error` is the parser's: a usage error, exit 2."""
    console = _console(config)
    ctx = zmq.Context()
    try:
        try:
            sub = Subscriber(list(config.sub), list(config.app_env), context=ctx, curve=key)
        except zmq.ZMQError as e:
            error(f"--sub {' '.join(config.sub)}: {e}")
        log.debug("subscribed to %s (app-env prefixes: %s)", ", ".join(config.sub), list(config.app_env) or "all")
        tail = _Tail(config, sub, stop)
        try:
            with sockets.eterm_is_clean():
                if config.mode == "stats":
                    tail.run_stats(console)
                else:
                    tail.run_lines(Renderer(config.mode, _palette(config, console), config.width or 0), console)
        finally:
            sub.close()
    finally:
        # destroy, not term: a Subscriber that failed half-way leaves sockets open.
        ctx.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
