"""`logjam-importer`: subscribe to devices, decode every message, and commit batches to the Delta table.

Worker I of N (`--worker I --workers N`) with `--own-devices` subscribes only to the
devices it owns (every N-th `--sub` endpoint from position I) and lands every stream they
carry; it resumes each device after the seq the table's app transaction for the device's
journal holds, whichever importer committed it. Without `--own-devices` it keeps the streams whose app-env CRC32 is I
modulo N, subscribing to everything and filtering after receipt so that its gap tracking
sees every sequence number, and its progress is its own share's. Batches are group-committed: one commit takes everything that arrived
while the previous one ran, bounded by `--batch-bytes`; at low load a row waits about
`--flush-interval`. SIGTERM flushes the current batch and exits 0.

With recovery on (the default; `--no-replay` turns it off) the importer drops duplicates, and fills every hole in a device's sequence
from the device's replay endpoint before going on; events the device journaled twice (one
`@metadata._id`) are written once. See docs/importer.md and docs/reliability.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from importer import decode_native, variant
from importer.batch import DEFAULT_BATCH_BYTES
from importer.dedupe import DEFAULT_CAPACITY
from importer.failures import describe
from importer.health import FAILING_FOR
from importer.metrics import ImporterMetrics
from table.partitioning import DEFAULT_MAX_NEW_APP_ENVS
from table.paths import OVERFLOW
from table.schema import DEFAULT_DATABASE
from table.session import DEFAULT_SPARK
from importer.config import DEFAULT_SUB, ImporterConfig
from importer.worker import Worker
from logjam import defaults, native, raw
from runtime import curve, lifecycle
from runtime.config import add_config_flag, parse_config, setup_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-importer", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--sub", action="append", metavar="tcp://HOST:PORT",
                   help=f"device PUB endpoint; repeatable, or comma-separated (default {DEFAULT_SUB})")
    p.add_argument("--spark", default=DEFAULT_SPARK, metavar="URL",
                   help="sc://HOST:PORT (Spark Connect), local[*] or spark://HOST:PORT (classic session)")
    p.add_argument("--warehouse", metavar="DIR",
                   help="warehouse root; the table is the Delta table <DIR>/messages, created when missing "
                        "(default: ask --spark for its spark.sql.warehouse.dir)")
    p.add_argument("--database", default=DEFAULT_DATABASE, help="catalog database of the messages table")
    p.add_argument("--worker", type=int, metavar="I", help="this worker's number, 0..N-1")
    p.add_argument("--workers", type=int, metavar="N", help="number of workers sharing the streams")
    p.add_argument("--own-devices", action="store_true",
                   help="worker I of N owns the --sub endpoints at positions I, I+N, ...: it subscribes to those only "
                        "and lands all their streams (N must not exceed the number of --sub endpoints)")
    p.add_argument("--app-env", action="append", metavar="PREFIX", help="only streams starting with PREFIX; repeatable")
    p.add_argument("--flush-interval", type=float, default=0.5,
                   help="seconds a row waits for more before an idle writer takes its batch (default 0.5: a row is "
                        "queryable within about a second of arriving)")
    p.add_argument("--batch-bytes", type=int, default=DEFAULT_BATCH_BYTES,
                   help=f"largest batch, in bytes of decoded rows (default {DEFAULT_BATCH_BYTES >> 20} MiB)")
    p.add_argument("--batch-rows", type=int, default=None, help="also cut a batch at this many rows (default: no limit)")
    p.add_argument("--write-timeout", type=float, default=120.0,
                   help="a commit under way this long is reported as stalled (default 120 s)")
    p.add_argument("--unhealthy-after", type=float, default=FAILING_FOR, metavar="SECONDS",
                   help=f"writes failing this long in a row make /healthz unhealthy (default {FAILING_FOR:g} s, or "
                        "--write-timeout if shorter)")
    p.add_argument("--max-new-app-envs", type=int, default=DEFAULT_MAX_NEW_APP_ENVS, metavar="N",
                   help="partitions per date this worker lets new streams make; further new streams that day go to app_env "
                        f"'{OVERFLOW}' with their name in original_app_env (default {DEFAULT_MAX_NEW_APP_ENVS})")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus /metrics and /healthz on this port (default off)")
    p.add_argument("--metrics-port-offset", type=int, default=0, metavar="N",
                   help="add N to --metrics-port, e.g. the worker number under supervisord's numprocs (default 0)")
    p.add_argument("--rcvhwm", type=int, default=100_000, help="SUB receive high-water mark (messages)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="scratch space for probing rows whose writes keep failing (default $LOGJAM_DATA_DIR/importer, "
                        "else ./data/importer)")
    p.add_argument("--replay-port", type=int, default=defaults.REPLAY_PORT,
                   help="devices' replay port, on the host of the --sub endpoint (default %(default)s)")
    p.add_argument("--replay-ports", metavar="PORT,PORT,...",
                   help="each --sub endpoint's replay port, in --sub order (devices sharing a host); "
                        "default --replay-port for all")
    p.add_argument("--replay-timeout", type=float, default=10.0, help="seconds to wait for a replay answer")
    p.add_argument("--no-replay", action="store_true",
                   help="no resume and no replay: gaps are only counted (devices without --data-dir)")
    p.add_argument("--dedupe-keys", type=int, default=DEFAULT_CAPACITY, metavar="N",
                   help=f"remember the last N event ids (@metadata._id) written and skip repeats; 0 turns it off "
                        f"(default {DEFAULT_CAPACITY})")
    p.add_argument("--retention-days", type=int, default=0, metavar="N",
                   help="the table's retention, as given to logjam-spark: an event whose time is more than N days "
                        "before it arrived (or more than a day after) is filed under the day it arrived, so "
                        "retention never drops it early (default 0: no retention, only the future is bounded)")
    curve.add_client_flags(p)
    p.add_argument("-v", "--verbose", action="store_true")
    add_config_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_config(build_parser(), argv, ImporterConfig.from_flags)
    if args.check:
        from importer.checks import check_importer

        return check_importer(config)
    log = setup_logging("logjam-importer", config.verbose)
    try:
        # Which C paths run (LOGJAM_NATIVE); under `require` a missing build stops the importer here.
        native.announce(log, [raw.MODULE, decode_native.MODULE, variant.MODULE])
        key = config.curve.load(config.owned)
    except (native.NativeUnavailable, curve.KeyFileError) as e:
        log.error("cannot start: %s", e)
        return 1
    stop = lifecycle.stop_event()
    metrics = ImporterMetrics(config.worker_id)
    worker = Worker(config, stop, metrics, key)
    if config.metrics_port:
        from importer.health import worker_health

        metrics.serve(config.metrics_port, health=lambda: worker_health(worker))
    try:
        status = worker.start()
    except Exception as e:  # the table cannot be opened (its store away, a feature refused): supervisord retries
        log.error("cannot start: %s", describe(e))
        log.debug("start failed", exc_info=True)
        status = 1
    if status is not None:
        lifecycle.exit_skipping_atexit(status)
    lifecycle.exit_with(worker.run)


if __name__ == "__main__":
    sys.exit(main())
