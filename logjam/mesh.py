"""`make up`, `make down`, `make status`: run supervisord.conf with the LOGJAM_* defaults filled in.

supervisord's `%(ENV_X)s` has no default syntax, so this module supplies the defaults,
creates the data and log directories, runs supervisord in the foreground, and prints
where everything listens once every program is RUNNING. Ctrl-C stops the mesh cleanly.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

DEFAULTS = {
    "LOGJAM_DATA_DIR": "data",
    "LOGJAM_BIND": "0.0.0.0",
    "LOGJAM_DEVICE_ID": "1",
    "LOGJAM_ROUTER_PORT": "9604",
    "LOGJAM_PULL_PORT": "9605",
    "LOGJAM_PUB_PORT": "9606",
    "LOGJAM_STATS_PORT": "9621",
    "LOGJAM_REPLAY_PORT": "9607",
    "LOGJAM_SPARK_PORT": "15002",
    "LOGJAM_JDBC_PORT": "10000",
    "LOGJAM_TABLE_METRICS_PORT": "9630",
    "LOGJAM_RETENTION_DAYS": "7",
    "LOGJAM_SPARK_MASTER": "local[*]",
    "LOGJAM_LUMBERJACK_PORT": "5044",
    "LOGJAM_COURIER_PORT": "5043",
    "LOGJAM_SEGMENT_PORT": "12345",
    "LOGJAM_RUSTLOG_PORT": "9092",
    "LOGJAM_IMPORTERS": "2",
}


def mesh_environment(config: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment supervisord needs: LOGJAM_* defaults, an absolute data dir that exists."""
    env = dict(os.environ if base is None else base)
    for key, value in DEFAULTS.items():
        env.setdefault(key, value)
    data = Path(env["LOGJAM_DATA_DIR"])
    if not data.is_absolute():
        data = config.parent / data
    env["LOGJAM_DATA_DIR"] = str(data.resolve())
    (data / "logs").mkdir(parents=True, exist_ok=True)
    return env


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def status(config: Path, env: dict[str, str]) -> dict[str, str]:
    """Program name -> supervisord state, or {} while supervisord is not answering."""
    out = subprocess.run(
        [_bin("supervisorctl"), "-c", str(config), "status"], env=env, capture_output=True, text=True
    ).stdout
    states = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isupper():
            states[parts[0]] = parts[1]
    return states


def banner(env: dict[str, str]) -> str:
    e = env.get
    bin_dir = Path(sys.executable).parent
    rel = os.path.relpath(bin_dir)
    return f"""
logjam-mesh is up. Data and logs: {e('LOGJAM_DATA_DIR')}

  Logjam device   ROUTER tcp://{e('LOGJAM_BIND')}:{e('LOGJAM_ROUTER_PORT')}  PULL :{e('LOGJAM_PULL_PORT')}  PUB :{e('LOGJAM_PUB_PORT')}  stats :{e('LOGJAM_STATS_PORT')}  replay :{e('LOGJAM_REPLAY_PORT')}
  Lumberjack      tcp :{e('LOGJAM_LUMBERJACK_PORT')}   (Beats, logstash-forwarder)
  Log Courier     tcp :{e('LOGJAM_COURIER_PORT')}
  Segment append  tcp :{e('LOGJAM_SEGMENT_PORT')}  (Pravega wire protocol)
  RustLog         tcp :{e('LOGJAM_RUSTLOG_PORT')}
  Spark Connect   sc://127.0.0.1:{e('LOGJAM_SPARK_PORT')}  ({e('LOGJAM_IMPORTERS')} importers)
  JDBC            jdbc:hive2://127.0.0.1:{e('LOGJAM_JDBC_PORT')}  (table logjam.messages)

Send:   echo hello | {rel}/logjam-send logjam --to 127.0.0.1:{e('LOGJAM_ROUTER_PORT')}
Tail:   {rel}/logjam-tail --sub tcp://127.0.0.1:{e('LOGJAM_PUB_PORT')}
Query:  {rel}/logjam-sql --spark sc://127.0.0.1:{e('LOGJAM_SPARK_PORT')} "SELECT app_env, count(*) FROM messages GROUP BY 1"
Stop:   Ctrl-C here, or `make down`
"""


def _log_offsets(env: dict[str, str]) -> dict[Path, int]:
    logs = Path(env["LOGJAM_DATA_DIR"], "logs")
    return {p: p.stat().st_size for p in logs.glob("logjam-importer-*.log")}


def importers_subscribed(env: dict[str, str], offsets: dict[Path, int]) -> bool:
    """Every importer has logged "subscribed" since we started (so events sent now land)."""
    logs = Path(env["LOGJAM_DATA_DIR"], "logs")
    want = int(env["LOGJAM_IMPORTERS"])
    ready = 0
    for i in range(want):
        path = logs / f"logjam-importer-{i}.log"
        try:
            with open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                ready += b" subscribed to " in f.read()
        except OSError:
            pass
    return ready == want


def up(config: Path, ready_timeout: float = 180.0) -> int:
    env = mesh_environment(config)
    offsets = _log_offsets(env)
    print(f"starting logjam-mesh (Spark takes ~30 s); logs in {env['LOGJAM_DATA_DIR']}/logs", flush=True)
    proc = subprocess.Popen([_bin("supervisord"), "-c", str(config), "-n"], env=env)
    # The terminal's Ctrl-C reaches supervisord too; we only wait for it to finish stopping.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    deadline = time.monotonic() + ready_timeout
    announced = False
    stable = 0  # consecutive polls with everything RUNNING: a crashing program flickers through RUNNING
    while proc.poll() is None:
        if not announced:
            states = status(config, env)
            stable = stable + 1 if states and all(s == "RUNNING" for s in states.values()) else 0
            if stable >= 3 and importers_subscribed(env, offsets):
                try:
                    print(banner(env), flush=True)
                except OSError:  # nobody is reading our stdout any more; keep running
                    pass
                announced = True
            elif time.monotonic() > deadline:
                print(f"mesh not fully up after {ready_timeout:.0f}s: {states}; see {env['LOGJAM_DATA_DIR']}/logs", flush=True)
                announced = True
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    return proc.returncode


def ctl(config: Path, args: Sequence[str]) -> int:
    env = mesh_environment(config)
    return subprocess.call([_bin("supervisorctl"), "-c", str(config), *args], env=env)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m logjam.mesh", description=__doc__)
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--config", default="supervisord.conf", type=Path)
    args = p.parse_args(argv)
    config = args.config.resolve()
    if args.action == "up":
        return up(config)
    return ctl(config, ["shutdown"] if args.action == "down" else ["status"])


if __name__ == "__main__":
    sys.exit(main())
