"""`logjam-device`: flags (logjam-tools' short forms), optional TOML config, and the run loop."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from logjam import defaults, endpoints, native
from runtime import curve, lifecycle
from runtime.check import Checker
from runtime.config import FSYNC_POLICIES, add_config_flag, fsync_policy, parse_config, setup_logging
from logjam.meta import Compression
from devices import native as devices_native
from devices.config import DeviceConfig
from devices.device import Device


def _compression(value: str) -> int:
    try:
        return Compression.parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _u32(value: str) -> int:
    n = int(value)
    if not 0 <= n < 2**32:
        raise argparse.ArgumentTypeError(f"{value} does not fit in 32 bits")
    return n


def _positive(value: str) -> float:
    x = float(value)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return x


def _positive_int(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return n


def _non_negative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return n


def _non_negative(value: str) -> float:
    x = float(value)
    if x < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="logjam-device", allow_abbrev=False,
        description="Accept Logjam messages on ROUTER and PULL, renumber them, and publish them on PUB.",
    )
    p.add_argument("-t", "--router-port", type=int, default=defaults.ROUTER_PORT, help="ROUTER port for DEALER clients (default %(default)s)")
    p.add_argument("-p", "--pull-port", type=int, default=defaults.PULL_PORT, help="PULL port for PUSH clients (default %(default)s)")
    p.add_argument("-P", "--pub-port", type=int, default=defaults.PUB_PORT, help="PUB port for subscribers (default %(default)s)")
    p.add_argument("-s", "--stats-port", type=int, default=defaults.STATS_PORT, help="PUB port for once-a-second stats (default %(default)s)")
    p.add_argument("--bind", default="*", metavar="ADDRESS", help="address to bind every socket to (default *)")
    p.add_argument("-d", "--device-id", type=_u32, default=0, help="this device's number in published meta (default 0)")
    p.add_argument(
        "-x", "--compress", type=_compression, default=Compression.NONE, metavar="METHOD",
        help="compress bodies that arrive uncompressed: none, zlib, snappy or lz4 (default none)",
    )
    p.add_argument("-R", "--rcv-hwm", type=int, default=100_000, help="receive high-water mark of ROUTER and PULL (default 100000)")
    p.add_argument("-S", "--snd-hwm", type=int, default=1_000_000, help="send high-water mark of PUB (default 1000000)")
    p.add_argument("--heartbeat-interval", type=_positive, default=5.0, metavar="SECONDS", help="seconds between heartbeats (default 5)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus text on this port (default off)")
    j = p.add_argument_group("journal and replay (on with --data-dir)")
    j.add_argument("--data-dir", metavar="DIR", help="keep a durable journal of every accepted message in DIR/journal "
                   "and serve it on --replay-port (default: no journal)")
    j.add_argument("--journal-fsync", type=fsync_policy, choices=FSYNC_POLICIES, default="interval",
                   help="always: fsync every batch before its acks (survives power loss); interval: at most every "
                   "--journal-fsync-interval-ms (power loss may lose that much); never: page cache only "
                   "(survives a process kill, not a power loss) (default interval)")
    j.add_argument("--journal-fsync-interval-ms", type=_positive_int, default=100, metavar="MS",
                   help="period of the interval policy's fsyncs and of retention checks (default 100)")
    j.add_argument("--journal-segment-bytes", type=_positive_int, default=64 * 1024 * 1024, metavar="BYTES",
                   help="start a new segment file after this many bytes (default 64 MiB)")
    j.add_argument("--journal-retention-bytes", type=_non_negative_int, default=1024 * 1024 * 1024, metavar="BYTES",
                   help="delete the oldest segments beyond this total size; 0: no limit (default 1 GiB)")
    j.add_argument("--journal-retention-hours", type=_non_negative, default=24.0, metavar="HOURS",
                   help="delete segments last written longer ago than this; 0: no limit (default 24)")
    j.add_argument("--no-ipc", action="store_true",
                   help="serve TCP only; by default a device with --data-dir serves every socket on its own host "
                        "too, as ipc://DIR/ipc/<socket>, without CURVE and open only to its user (docs/security.md)")
    j.add_argument("--replay-port", type=int, default=defaults.REPLAY_PORT,
                   help="ROUTER port of the replay endpoint; without --data-dir it answers info only (default %(default)s)")
    p.add_argument("--max-importer-lag", type=_non_negative, default=10.0, metavar="SECONDS",
                   help="accept no input while an in-sync importer's committed rows are this far behind "
                        "(default 10; 0 turns flow control off)")
    p.add_argument("--max-importer-lag-messages", type=int, default=500_000, metavar="N",
                   help="hold input too while an in-sync importer is more than N messages behind "
                        "(default 500000: below --snd-hwm, so a lagging importer is held, not dropped)")
    p.add_argument("--importer-evict-after", type=_positive, default=60.0, metavar="SECONDS",
                   help="stop waiting for an importer that stays behind that long (default 60)")
    curve.add_server_flags(p)
    m = p.add_argument_group("several devices on one host (supervisord's numprocs)")
    m.add_argument("--instance", type=_non_negative_int, default=0, metavar="K",
                   help="this is device K (0-based) of a host: K is added to -d, K * --instance-port-step to every "
                        "port, and K > 0 keeps its journal in <--data-dir>-K (default 0: flags as given)")
    m.add_argument("--instance-port-step", type=_positive_int, default=100, metavar="N",
                   help="port distance between two devices of a host (default 100)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_config_flag(p)
    return p


def check(config: DeviceConfig) -> int:
    """--check: ports, the journal's directory, the key files; print what would run."""
    c = Checker("logjam-device")
    ports = {"--router-port": config.router_port, "--pull-port": config.pull_port, "--pub-port": config.pub_port,
             "--stats-port": config.stats_port, "--replay-port": config.replay_port, "--metrics-port": config.metrics_port}
    for flag, port in ports.items():
        c.port(flag, port)
    c.distinct_ports(ports)
    data_dir = config.data_dir
    if data_dir:
        c.writable_dir("--data-dir", data_dir)
        c.writable_dir("--data-dir (journal)", Path(data_dir) / "journal")
    c.would_run(f"device {config.device_id}: ROUTER tcp://{config.bind}:{config.router_port}, PULL :{config.pull_port}, "
                f"PUB :{config.pub_port}, stats :{config.stats_port}, LOGJAM_NATIVE={native.mode()}")
    c.would_run(f"journal in {Path(data_dir).absolute() / 'journal'} (fsync {config.journal_fsync}), "
                f"replay on :{config.replay_port}" if data_dir else f"no journal; replay :{config.replay_port} answers info only")
    if data_dir and config.ipc:
        c.would_run(f"ipc endpoints for this host in {endpoints.ipc_dir(data_dir)} (mode 0700, no CURVE)"
                    if endpoints.ipc_fits(endpoints.ipc_dir(data_dir)) else
                    f"no ipc endpoints: {endpoints.ipc_dir(data_dir)} is too long for a Unix socket path")
    c.would_run(f"metrics and /healthz on :{config.metrics_port}" if config.metrics_port else "no metrics port")
    if config.curve is not None:
        config.curve.check(c)
    return c.report()


def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_config(build_parser(), argv, DeviceConfig.from_flags)
    if args.check:
        return check(config)
    log = setup_logging("logjam-device", config.verbose)
    stop = lifecycle.stop_event()
    try:
        # The key files, the journal, the sockets, the replay thread: here, in the loop's thread.
        device = Device(config).open()
    except Exception as e:  # a missing key file, a port in use, a bad address: say which, exit non-zero
        log.error("cannot start: %s", e)
        return 1
    if config.metrics_port:
        from devices.metrics import serve

        serve(device, config.metrics_port, "0.0.0.0" if config.bind == "*" else config.bind)
    log.info(
        "device %d (%s engine): ROUTER %d, PULL %d, PUB %d, stats %d on %s%s",
        config.device_id, device.engine, config.router_port, config.pull_port, config.pub_port, config.stats_port,
        config.bind, f", metrics {config.metrics_port}" if config.metrics_port else "",
    )
    security = config.curve
    if security is not None:
        (log.warning if security.plaintext else log.info)("%s", security.describe())
    if device.gate is not None:
        signal.signal(signal.SIGHUP, lambda signum, frame: device.gate.reload())  # type: ignore[union-attr]
        log.info("CURVE allowlist: %d keys; SIGHUP reads %s again", len(device.gate.allowed), security.allow_dir)  # type: ignore[union-attr]
    log.info("%s%s", native.describe([devices_native.MODULE]),
             " (the C loop does not compress: Python loop with --compress)" if config.compress else "")
    if device.ipc_dir is not None:
        log.info("ipc endpoints for this host in %s (mode 0700, no CURVE): %s", device.ipc_dir, ", ".join(endpoints.SOCKETS))
    if device.journal is not None:
        log.info(
            "journal %s in %s/journal (fsync %s), continuing after seq %d; replay on port %d",
            device.journal_id, config.data_dir, config.journal_fsync, device.seq, config.replay_port,
        )
    else:
        log.info("no journal (id %s for this run); replay port %d answers info only", device.journal_id, config.replay_port)
    try:
        device.run(stop)
    finally:
        snap = device.snapshot()
        device.close()
    log.info(
        "stopped: seq %d, published %d, received %s, dropped %d",
        snap["seq"], snap["published"], snap["received"], sum(snap["dropped"].values()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
