"""The mesh's defaults that several programs share: the data root and the default ports.

Defined here once; every program and tool reads them from here (the device's flags, the
bridges' and importers' `--device`/`--sub` defaults, logjam-tail, logjam-send and
`make up`'s environment in tools/mesh.py), so that a port moves in one place.

The data root is `$LOGJAM_DATA_DIR`, else `./data` relative to where the process was
started (supervisord starts everything from the repository root, so that is `<repo>/data`),
made absolute once, here: the keys, the devices' ipc endpoints, the importers' state and
the warehouse all lie below it.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "LOGJAM_DATA_DIR"
DATA_DIR = "data"  # without $LOGJAM_DATA_DIR, relative to where a process starts (`make up`: the repository)

# Device K of a host listens on each of these + K * --instance-port-step (devices/cli.py).
ROUTER_PORT = 9604  # DEALER clients: Logjam agents, the bridges, logjam-send
PULL_PORT = 9605  # PUSH clients
PUB_PORT = 9606  # subscribers: importers, logjam-tail
REPLAY_PORT = 9607  # the journal's replay endpoint (logjam/replay.py)
STATS_PORT = 9621  # once-a-second stats
# By socket name (logjam/endpoints.py's SOCKETS).
DEVICE_PORTS = {"router": ROUTER_PORT, "pull": PULL_PORT, "pub": PUB_PORT, "stats": STATS_PORT, "replay": REPLAY_PORT}


# Each bridge's default --listen port (a protocol's usual one, or an unprivileged stand-in),
# by the name logjam-send knows it under: `syslog` is the syslog bridge's TCP and UDP, `relp`
# its --relp instance (`make up` runs both), `otlp-grpc` the OTLP bridge's --grpc-listen.
BRIDGE_PORTS = {"lumberjack": 5044, "courier": 5043, "segment": 12345, "rustlog": 9092, "otlp": 4318,
                "otlp-grpc": 4317, "syslog": 5514, "relp": 2514}
# logjam-spark's Spark Connect and HiveServer2 (JDBC) ports.
SPARK_PORT = 15002
JDBC_PORT = 10000


def data_root() -> Path:
    """`$LOGJAM_DATA_DIR`, else `./data`, absolute."""
    return Path(os.environ.get(DATA_DIR_ENV) or DATA_DIR).resolve()


def device_endpoint(name: str, host: str = "127.0.0.1") -> str:
    """`tcp://HOST:PORT` of a device's socket `name` on its default port (a client's default)."""
    return f"tcp://{host}:{DEVICE_PORTS[name]}"
