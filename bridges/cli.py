"""`logjam-bridge <protocol>`: one entry point for every bridge, with the common flags."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import sys
from pathlib import Path
from typing import Sequence

from bridges.host.config import BridgeConfig, Knobs, flag
from bridges.host.protocol import BridgeProtocol
from logjam import defaults, native
from logjam.endpoints import needs_curve
from runtime import curve
from runtime.check import Checker
from runtime.config import add_config_flag, parse_config, setup_logging

PROTOCOLS = {
    "lumberjack": "bridges.lumberjack.bridge:Bridge",
    "courier": "bridges.courier.bridge:Bridge",
    "segment": "bridges.segment.bridge:Bridge",
    "rustlog": "bridges.rustlog.bridge:Bridge",
    "otlp": "bridges.otlp.bridge:Bridge",
    "syslog": "bridges.syslog.bridge:Bridge",
}


def load_protocol(name: str) -> type[BridgeProtocol]:
    module, _, attr = PROTOCOLS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def build_parser(cls: type[BridgeProtocol]) -> argparse.ArgumentParser:
    name = cls.name
    p = argparse.ArgumentParser(
        prog=f"logjam-bridge {name}", allow_abbrev=False,
        description=f"Serve the {name} protocol and forward every event to a logjam-device.",
    )
    p.add_argument("--listen", default=f"0.0.0.0:{cls.default_port}", metavar="HOST:PORT", help="where clients connect (default %(default)s)")
    p.add_argument("--device", action="append", metavar="tcp://HOST:PORT", help="device ROUTER endpoint; repeatable or comma-separated, events are spread over them "
                   f"(default {defaults.device_endpoint('router')})")
    p.add_argument("--app-env", default=f"{name}-default", help="stream name events are published under (default %(default)s)")
    p.add_argument("--app-env-field", metavar="NAME", help="event field (dotted path) whose value overrides --app-env")
    p.add_argument("--topic", default=f"logs.{name}", help="Logjam topic (default %(default)s)")
    p.add_argument("--compress", default="none", choices=["none", "zlib", "snappy", "lz4"], help="compression of bodies sent to the device")
    p.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM); turns TLS on")
    p.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    p.add_argument("--tls-key-password", metavar="PASSWORD", help="password of --tls-key")
    p.add_argument("--tls-client-ca", metavar="FILE", help="CA for client certificates")
    p.add_argument("--tls-client-auth", choices=["none", "optional", "required"], help="default: required when --tls-client-ca is given, else none")
    p.add_argument("--tls-handshake-timeout", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--max-frame-size", type=int, default=cls.default_max_frame, metavar="BYTES", help="checked before any allocation (default %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=cls.default_idle_timeout, metavar="SECONDS", help="0 disables (default %(default)s)")
    p.add_argument("--frame-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a frame (or handshake, or append) a client began must be complete within this much "
                        "waiting for its bytes, however slowly they trickle in; 0 disables (default %(default)s)")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open client connections; at the limit the longest-idle one is shed (default %(default)s)")
    p.add_argument("--max-connections-per-peer", type=int, default=256, metavar="N",
                   help="open connections from one client address; 0 disables (default %(default)s)")
    p.add_argument("--shed-idle-after", type=float, default=5.0, metavar="SECONDS",
                   help="at a connection limit, close a connection idle this long to admit a new client; "
                        "0 never sheds (default %(default)s)")
    p.add_argument("--max-inflated-bytes", type=int, default=128 * 2**20, metavar="BYTES",
                   help="decompressed bytes decoded and not yet acknowledged, all connections together; "
                        "connections wait for room (default %(default)s)")
    p.add_argument("--max-inflight", type=int, default=20_000, help="events awaiting the device, process-wide")
    p.add_argument("--device-deadline", type=float, default=5.0, metavar="SECONDS",
                   help="a device that owes replies and answers none for this long is hung: it gets no new "
                        "batches until it answers (default %(default)s)")
    p.add_argument("--homes-file", metavar="FILE",
                   help="where the bridge remembers which device each recent batch went to, so that a client "
                        "resending after a bridge restart reaches the same device (default: in memory only)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus text on this port")
    add_knob_flags(p, cls.knobs)
    p.add_argument("-v", "--verbose", action="store_true")
    curve.add_client_flags(p)
    add_config_flag(p)
    cls.add_arguments(p)
    return p


# The host's shared knobs (bridges/host/config.py `Knobs`): type, metavar, help.
KNOB_FLAGS: dict[str, tuple[type, str, str]] = {
    "pipeline_depth": (int, "N", "per connection: batches awaiting the device at once; beyond, the connection "
                                 "stops reading"),
    "batch_size": (int, "N", "events per pipelined publish to the device"),
    "keepalive_interval": (float, "SECONDS", "while a client's events wait for the device, tell it so this often"),
}


def add_knob_flags(p: argparse.ArgumentParser, knobs: Knobs) -> None:
    """The shared knobs the protocol has, with its defaults; its old names of them, hidden."""
    for name, (kind, metavar, text) in KNOB_FLAGS.items():
        default = getattr(knobs, name)
        if default is not None:
            # No argparse default: an old name given alone must not lose to it (HostConfig resolves).
            p.add_argument(flag(name), type=kind, metavar=metavar, help=f"{text} (default {default:g})")
    for old, new in knobs.renamed:
        p.add_argument(flag(old), type=KNOB_FLAGS[new][0], help=argparse.SUPPRESS)


def check(cls: type[BridgeProtocol], bridge: BridgeConfig) -> int:
    """--check of the config a start would run with (its flags were validated when it was built):
    the listen address, TLS files (loaded as a start would), data dir."""
    from bridges.host.server import split_listen
    from bridges.host.tls import server_context

    c = Checker(f"logjam-bridge {cls.name}")
    config = bridge.host
    for old, new in config.deprecated:
        c.warning(f"{old} is deprecated and will be removed in the next release; use {new}")
    listen = c.attempt(f"--listen {config.listen}", lambda: split_listen(config.listen))
    if listen is not None:
        c.port("--listen", listen[1], zero_ok=True)
    c.port("--metrics-port", config.metrics_port)
    if listen is not None:
        c.distinct_ports({"--listen": listen[1], "--metrics-port": config.metrics_port})
    tls = "plain TCP"
    if config.tls.cert or config.tls.key or config.tls.client_ca:
        for flag, path in (("--tls-cert", config.tls.cert), ("--tls-key", config.tls.key),
                           ("--tls-client-ca", config.tls.client_ca)):
            c.readable_file(flag, path)
        if c.attempt("TLS certificate, key and client CA load", lambda: server_context(config.tls)) is not None:
            tls = f"TLS (client certificates: {config.tls.auth}; SIGHUP reloads the files)"
    cls.check(bridge.protocol, config, c)
    data_dir = cls.data_dir(bridge.protocol)
    c.writable_dir("--data-dir", data_dir)
    c.would_run(f"{cls.name} bridge on {config.listen} ({tls}), forwarding to {', '.join(config.device)} "
                f"as app-env {config.app_env!r}, topic {config.topic!r}")
    if data_dir:
        c.would_run(f"store in {Path(data_dir).absolute()}")
    c.would_run(f"metrics and /healthz on :{config.metrics_port}" if config.metrics_port else "no metrics port")
    config.curve.check(c, config.device)
    return c.report()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in PROTOCOLS:
        wanted = argv[0] if argv else ""
        if wanted not in ("-h", "--help", ""):
            print(f"logjam-bridge: unknown protocol {wanted!r}", file=sys.stderr)
        print(f"usage: logjam-bridge {{{','.join(PROTOCOLS)}}} [flags]   (logjam-bridge PROTOCOL --help)", file=sys.stderr)
        return 0 if wanted in ("-h", "--help") else (1 if "--check" in argv else 2)
    cls = load_protocol(argv[0])
    args, config = parse_config(build_parser(cls), argv[1:], BridgeConfig.builder(cls.Config, cls.knobs))
    if args.check:
        return check(cls, config)
    log = setup_logging(f"logjam-bridge-{cls.name}", args.verbose)
    for old, new in config.host.deprecated:
        log.warning("%s is deprecated and will be removed in the next release; use %s (flag or TOML key)", old, new)
    from bridges.host.server import BridgeServer

    # Which C paths run (LOGJAM_NATIVE); under `require` a missing build stops the bridge here.
    modules = ["bridges.host._native_link"] + (["bridges.lumberjack._native_scan"] if cls.name == "lumberjack" else [])
    try:
        log.info("%s", native.describe(modules))
        key = config.host.curve.load(config.host.device)
    except (native.NativeUnavailable, ValueError) as e:  # curve.KeyFileError is a ValueError
        log.error("cannot start: %s", e)
        return 1
    log.info("to the devices: %s", ", ".join(f"{d} ({'CURVE' if key is not None and needs_curve(d) else 'plaintext'})"
                                             for d in config.host.device))

    # A bridge makes a few short-lived dicts per event and keeps almost nothing: with the
    # default gen-0 threshold (700) the cycle collector ran every few events and scanned
    # every in-flight batch each time. Nothing is lost by collecting rarely here.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    asyncio.run(BridgeServer(cls, config.host, config.protocol, key).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
