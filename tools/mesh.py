"""`make up`, `make down`, `make status`, `make check`: run supervisord.conf with the LOGJAM_* defaults filled in.

supervisord's `%(ENV_X)s` has no default syntax, so this module supplies the defaults,
creates the data and log directories, runs supervisord in the foreground, and prints
where everything listens once every program is RUNNING. Ctrl-C stops the mesh cleanly.
`status` adds each program's /healthz verdict (every process serves /metrics and
/healthz on its own port, METRICS_PORTS); `check` runs every program's command line
from supervisord.conf with `--check` and exits 1 if any of them fails.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from logjam import defaults, endpoints
from table.schema import DEFAULT_DATABASE, TABLE_NAME

DEFAULTS = {
    "LOGJAM_DATA_DIR": defaults.DATA_DIR,
    "LOGJAM_BIND": "0.0.0.0",
    "LOGJAM_DEVICE_ID": "1",
    "LOGJAM_ROUTER_PORT": str(defaults.ROUTER_PORT),
    "LOGJAM_PULL_PORT": str(defaults.PULL_PORT),
    "LOGJAM_PUB_PORT": str(defaults.PUB_PORT),
    "LOGJAM_STATS_PORT": str(defaults.STATS_PORT),
    "LOGJAM_REPLAY_PORT": str(defaults.REPLAY_PORT),
    "LOGJAM_SPARK_PORT": str(defaults.SPARK_PORT),
    "LOGJAM_JDBC_PORT": str(defaults.JDBC_PORT),
    "LOGJAM_TABLE_METRICS_PORT": "9630",
    "LOGJAM_RETENTION_DAYS": "7",
    "LOGJAM_SPARK_MASTER": "local[*]",
    "LOGJAM_LUMBERJACK_PORT": str(defaults.BRIDGE_PORTS["lumberjack"]),
    "LOGJAM_COURIER_PORT": str(defaults.BRIDGE_PORTS["courier"]),
    "LOGJAM_SEGMENT_PORT": str(defaults.BRIDGE_PORTS["segment"]),
    "LOGJAM_RUSTLOG_PORT": str(defaults.BRIDGE_PORTS["rustlog"]),
    "LOGJAM_OTLP_GRPC_PORT": str(defaults.BRIDGE_PORTS["otlp-grpc"]),
    "LOGJAM_OTLP_HTTP_PORT": str(defaults.BRIDGE_PORTS["otlp"]),
    # Syslog over TCP and UDP share the number; 514 needs root.
    "LOGJAM_SYSLOG_PORT": str(defaults.BRIDGE_PORTS["syslog"]),
    "LOGJAM_RELP_PORT": str(defaults.BRIDGE_PORTS["relp"]),
    # Devices and importers (docs/scaling.md): importer I owns devices I, I+N, ... so N <= D.
    "LOGJAM_DEVICES": "2",
    "LOGJAM_IMPORTERS": "2",
    # Device K listens on each device port + K * this, and serves metrics on LOGJAM_DEVICE_METRICS_PORT + K * this.
    "LOGJAM_DEVICE_PORT_STEP": "100",
    # Prometheus /metrics and /healthz of every process (runtime.health); importer I serves
    # LOGJAM_IMPORTER_METRICS_PORT + I. logjam-spark's is LOGJAM_TABLE_METRICS_PORT.
    "LOGJAM_DEVICE_METRICS_PORT": "9631",
    "LOGJAM_LUMBERJACK_METRICS_PORT": "9632",
    "LOGJAM_COURIER_METRICS_PORT": "9633",
    "LOGJAM_SEGMENT_METRICS_PORT": "9634",
    "LOGJAM_RUSTLOG_METRICS_PORT": "9635",
    "LOGJAM_OTLP_METRICS_PORT": "9637",
    "LOGJAM_SYSLOG_METRICS_PORT": "9638",
    "LOGJAM_RELP_METRICS_PORT": "9639",
    "LOGJAM_IMPORTER_METRICS_PORT": "9640",
}

# supervisord program (process) name -> the variable holding its metrics port.
METRICS_PORTS = {
    "logjam-spark": "LOGJAM_TABLE_METRICS_PORT",
    "logjam-device": "LOGJAM_DEVICE_METRICS_PORT",
    "bridge-lumberjack": "LOGJAM_LUMBERJACK_METRICS_PORT",
    "bridge-courier": "LOGJAM_COURIER_METRICS_PORT",
    "bridge-segment": "LOGJAM_SEGMENT_METRICS_PORT",
    "bridge-rustlog": "LOGJAM_RUSTLOG_METRICS_PORT",
    "bridge-otlp": "LOGJAM_OTLP_METRICS_PORT",
    "bridge-syslog": "LOGJAM_SYSLOG_METRICS_PORT",
    "bridge-relp": "LOGJAM_RELP_METRICS_PORT",
}


# Every device's own port: device K listens on the variable's port + K * LOGJAM_DEVICE_PORT_STEP.
DEVICE_PORTS = ("LOGJAM_ROUTER_PORT", "LOGJAM_PULL_PORT", "LOGJAM_PUB_PORT", "LOGJAM_STATS_PORT",
                "LOGJAM_REPLAY_PORT", "LOGJAM_DEVICE_METRICS_PORT")
_PORT_OF = {name: f"LOGJAM_{name.upper()}_PORT" for name in endpoints.SOCKETS}


def device_port(env: dict[str, str], key: str, k: int) -> int:
    """Device K's port for `key` (one of DEVICE_PORTS)."""
    return int(env[key]) + k * int(env["LOGJAM_DEVICE_PORT_STEP"])


def device_data_dir(env: dict[str, str], k: int) -> Path:
    """Device K's --data-dir as supervisord.conf gives it (devices/config.py adds -K for K > 0)."""
    return Path(env["LOGJAM_DATA_DIR"], "device" if k == 0 else f"device-{k}")


def device_endpoint(env: dict[str, str], name: str, k: int) -> str:
    """Device K's socket `name` as the mesh's own processes reach it: its ipc endpoint, without CURVE
    (logjam/endpoints.py), unless the path is too long for a Unix socket; then TCP, with CURVE."""
    directory = endpoints.ipc_dir(device_data_dir(env, k))
    if endpoints.ipc_fits(directory):
        return endpoints.ipc_endpoint(directory, name)
    return f"tcp://127.0.0.1:{device_port(env, _PORT_OF[name], k)}"


def device_count(env: dict[str, str]) -> int:
    try:
        return max(1, int(env["LOGJAM_DEVICES"]))
    except ValueError:
        return 1


def topology_problems(env: dict[str, str]) -> list[str]:
    """What makes LOGJAM_DEVICES / LOGJAM_IMPORTERS unrunnable, said plainly."""
    try:
        d, n = int(env["LOGJAM_DEVICES"]), int(env["LOGJAM_IMPORTERS"])
    except ValueError:
        return [f"LOGJAM_DEVICES={env['LOGJAM_DEVICES']!r} and LOGJAM_IMPORTERS={env['LOGJAM_IMPORTERS']!r} "
                "must be whole numbers"]
    if d < 1 or n < 1:
        return [f"LOGJAM_DEVICES={d} and LOGJAM_IMPORTERS={n} must both be at least 1"]
    if n > d:
        return [f"LOGJAM_IMPORTERS={n} > LOGJAM_DEVICES={d}: every importer owns whole devices (importer I "
                f"owns devices I, I+{n}, ...), so importers {', '.join(map(str, range(d, n)))} would own none. "
                f"Set LOGJAM_DEVICES>={n} or LOGJAM_IMPORTERS<={d} (docs/scaling.md)"]
    return []


def orphaned_journals(env: dict[str, str]) -> list[str]:
    """Journals of devices LOGJAM_DEVICES no longer runs (it was lowered): nothing reads them now."""
    data, d = Path(env["LOGJAM_DATA_DIR"]), device_count(env)
    out = []
    for path in sorted(data.glob("device-*")):
        k = path.name.removeprefix("device-")
        if k.isdigit() and int(k) >= d and (path / "journal").is_dir():
            out.append(f"warning: {path} holds the journal of device {k}, which LOGJAM_DEVICES={d} does not run: "
                       f"what it accepted and the table does not have yet stays there until it runs again "
                       f"(raise LOGJAM_DEVICES; docs/operations.md, Scaling devices and importers)")
    return out


def mesh_environment(config: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment supervisord needs: LOGJAM_* defaults, an absolute data dir that exists, and
    the per-device lists derived from LOGJAM_DEVICES."""
    env = dict(os.environ if base is None else base)
    for key, value in DEFAULTS.items():
        env.setdefault(key, value)
    data = Path(env["LOGJAM_DATA_DIR"])
    if not data.is_absolute():
        data = config.parent / data
    env["LOGJAM_DATA_DIR"] = str(data.resolve())
    (data / "logs").mkdir(parents=True, exist_ok=True)
    devices = range(device_count(env))
    env["LOGJAM_EXTRA_DEVICES"] = str(len(devices) - 1)
    # The mesh's own clients (bridges, importers) reach the devices on this host through ipc.
    env["LOGJAM_DEVICE_ROUTERS"] = ",".join(device_endpoint(env, "router", k) for k in devices)
    env["LOGJAM_DEVICE_PUBS"] = ",".join(device_endpoint(env, "pub", k) for k in devices)
    env["LOGJAM_DEVICE_REPLAY_PORTS"] = ",".join(str(device_port(env, "LOGJAM_REPLAY_PORT", k)) for k in devices)
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


def ensure_keys(env: dict[str, str]) -> Path:
    """The mesh's CURVE certificates, created on first start as `logjam-keys init` creates them; every process finds them here."""
    from runtime.curve import ensure

    keys = Path(env["LOGJAM_DATA_DIR"], "keys")
    made = ensure(keys)
    if made:
        print(f"created CURVE certificates ({', '.join(made)}) in {keys}", flush=True)
    return keys


def _local_prefix(env: dict[str, str]) -> str:
    """`LOGJAM_DATA_DIR=... ` when the tools would not find this mesh (its ipc endpoints, its keys) from here."""
    data = Path(env["LOGJAM_DATA_DIR"])
    return "" if defaults.data_root() == data.resolve() else f"LOGJAM_DATA_DIR={data} "


def banner(env: dict[str, str]) -> str:
    e = env.get
    bin_dir = Path(sys.executable).parent
    rel = os.path.relpath(bin_dir)
    local = _local_prefix(env)
    return f"""
logjam-mesh is up. Data and logs: {e('LOGJAM_DATA_DIR')}

{device_lines(env)}
  Lumberjack      tcp :{e('LOGJAM_LUMBERJACK_PORT')}   (Beats, logstash-forwarder)
  Log Courier     tcp :{e('LOGJAM_COURIER_PORT')}
  Segment append  tcp :{e('LOGJAM_SEGMENT_PORT')}  (Pravega wire protocol)
  RustLog         tcp :{e('LOGJAM_RUSTLOG_PORT')}
  OTLP gRPC       tcp :{e('LOGJAM_OTLP_GRPC_PORT')}   (OpenTelemetry logs: LogsService/Export)
  OTLP HTTP       tcp :{e('LOGJAM_OTLP_HTTP_PORT')}   (OpenTelemetry logs: POST /v1/logs, protobuf and JSON)
  Syslog          tcp :{e('LOGJAM_SYSLOG_PORT')}  udp :{e('LOGJAM_SYSLOG_PORT')}  (RFC 5424/3164; TLS :6514 once given a certificate, docs/protocols/syslog.md)
  RELP            tcp :{e('LOGJAM_RELP_PORT')}  (rsyslog omrelp, acknowledged)
  Spark Connect   sc://127.0.0.1:{e('LOGJAM_SPARK_PORT')}  ({e('LOGJAM_IMPORTERS')} importers, each owning whole devices)
  JDBC            jdbc:hive2://127.0.0.1:{e('LOGJAM_JDBC_PORT')}  (table logjam.messages)
  CURVE           every ZeroMQ TCP port above; keys in {e('LOGJAM_DATA_DIR')}/keys, admitted clients in keys/allowed (SIGHUP the devices after a change)
  ipc             this host's processes reach device K at {e('LOGJAM_DATA_DIR')}/device[-K]/ipc/<socket> (mode 0700, no CURVE)
  Metrics+health  http://HOST:PORT/metrics and /healthz: spark :{e('LOGJAM_TABLE_METRICS_PORT')}  device K :{e('LOGJAM_DEVICE_METRICS_PORT')}+K*{e('LOGJAM_DEVICE_PORT_STEP')}  lumberjack :{e('LOGJAM_LUMBERJACK_METRICS_PORT')}  courier :{e('LOGJAM_COURIER_METRICS_PORT')}  segment :{e('LOGJAM_SEGMENT_METRICS_PORT')}  rustlog :{e('LOGJAM_RUSTLOG_METRICS_PORT')}  otlp :{e('LOGJAM_OTLP_METRICS_PORT')}  syslog :{e('LOGJAM_SYSLOG_METRICS_PORT')}  relp :{e('LOGJAM_RELP_METRICS_PORT')}  importers :{e('LOGJAM_IMPORTER_METRICS_PORT')}+I

Send:   echo hello | {local}{rel}/logjam-send logjam        (device 0 over ipc; from another host: --to HOST:{e('LOGJAM_ROUTER_PORT')} and the keys)
Tail:   {local}{rel}/logjam-tail                           (every device of this mesh, over ipc)
Query:  {rel}/logjam-sql --spark sc://127.0.0.1:{e('LOGJAM_SPARK_PORT')} "SELECT app_env, count(*) FROM messages GROUP BY 1"
Health: make status    Check a config: make check
Stop:   Ctrl-C here, or `make down`
"""


def device_lines(env: dict[str, str]) -> str:
    lines = []
    for k in range(device_count(env)):
        p = {key: device_port(env, key, k) for key in DEVICE_PORTS}
        lines.append(f"  Logjam device {int(env['LOGJAM_DEVICE_ID']) + k:<2} ROUTER tcp://{env['LOGJAM_BIND']}:{p['LOGJAM_ROUTER_PORT']}"
                     f"  PULL :{p['LOGJAM_PULL_PORT']}  PUB :{p['LOGJAM_PUB_PORT']}  stats :{p['LOGJAM_STATS_PORT']}"
                     f"  replay :{p['LOGJAM_REPLAY_PORT']}")
    return "\n".join(lines)


SPARK_LOG = "logjam-spark.log"


def log_offsets(env: dict[str, str]) -> dict[Path, int]:
    """Where each importer's log and logjam-spark's end now: what they log from here on is this start's."""
    logs = Path(env["LOGJAM_DATA_DIR"], "logs")
    return {p: p.stat().st_size for p in [*logs.glob("logjam-importer-*.log"), *logs.glob(SPARK_LOG)]}


def logged_since(path: Path, offsets: dict[Path, int], needle: bytes) -> bool:
    """Whether `path` has `needle` past its offset in `offsets` (from its start for a log new since)."""
    try:
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            return needle in f.read()
    except OSError:
        return False


def importers_subscribed(env: dict[str, str], offsets: dict[Path, int]) -> bool:
    """Every importer has logged "subscribed" since we started (so events sent now land)."""
    logs = Path(env["LOGJAM_DATA_DIR"], "logs")
    want = int(env["LOGJAM_IMPORTERS"])
    return sum(logged_since(logs / f"logjam-importer-{i}.log", offsets, b" subscribed to ") for i in range(want)) == want


def spark_table_ready(env: dict[str, str], offsets: dict[Path, int], database: str = DEFAULT_DATABASE) -> bool:
    """logjam-spark has logged since we started that its table exists and the catalog names it
    (warehouse/spark_server.py): Spark answering is not enough, a query could not name the table yet."""
    needle = f"table {database}.{TABLE_NAME} ready at ".encode()
    return logged_since(Path(env["LOGJAM_DATA_DIR"], "logs", SPARK_LOG), offsets, needle)


def up(config: Path, ready_timeout: float = 180.0) -> int:
    env = mesh_environment(config)
    problems = topology_problems(env)
    if problems:
        print("\n".join(f"cannot start logjam-mesh: {p}" for p in problems), file=sys.stderr, flush=True)
        return 2
    for warning in orphaned_journals(env):
        print(warning, file=sys.stderr, flush=True)
    ensure_keys(env)
    offsets = log_offsets(env)
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
            if stable >= 3 and importers_subscribed(env, offsets) and spark_table_ready(env, offsets):
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


def metrics_ports(env: dict[str, str]) -> dict[str, int]:
    """Process name -> the port of its /metrics and /healthz."""
    ports = {name: int(env[key]) for name, key in METRICS_PORTS.items()}
    for k in range(1, device_count(env)):
        ports[f"logjam-device-{k}"] = device_port(env, "LOGJAM_DEVICE_METRICS_PORT", k)
    base = int(env["LOGJAM_IMPORTER_METRICS_PORT"])
    for i in range(int(env["LOGJAM_IMPORTERS"])):
        ports[f"logjam-importer-{i}"] = base + i
    return ports


def health_report(env: dict[str, str]) -> tuple[bool, list[str]]:
    """(all healthy, one line per process: port, verdict, each check's detail)."""
    from runtime.health import fetch

    host = env["LOGJAM_BIND"] if env["LOGJAM_BIND"] not in ("0.0.0.0", "*", "::") else "127.0.0.1"
    healthy, lines = True, []
    for name, port in metrics_ports(env).items():
        # Only the device binds its metrics to LOGJAM_BIND; the others listen on every address or 127.0.0.1.
        code, doc = fetch(f"http://{host if name.startswith('logjam-device') else '127.0.0.1'}:{port}/healthz")
        if doc is None:
            healthy = False
            lines.append(f"  {name:<20} :{port:<5}  no answer" + (f" (HTTP {code})" if code else ""))
            continue
        healthy = healthy and bool(doc.get("healthy"))
        checks = "; ".join(f"{k}: {v['detail']}" if v["ok"] else f"{k} FAILING: {v['detail']}"
                           for k, v in doc.get("checks", {}).items())
        lines.append(f"  {name:<20} :{port:<5}  {'healthy' if doc.get('healthy') else 'UNHEALTHY'}  {checks}")
    return healthy, lines


def show_status(config: Path) -> int:
    env = mesh_environment(config)
    code = subprocess.call([_bin("supervisorctl"), "-c", str(config), "status"], env=env)
    healthy, lines = health_report(env)
    print("\n/healthz (metrics at the same port's /metrics):")
    print("\n".join(lines), flush=True)
    return code or (0 if healthy else 1)


def program_commands(config: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """Process name -> its command line, as supervisord itself expands supervisord.conf with `env`."""
    from supervisor.options import ServerOptions

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        options = ServerOptions()
        options.realize(args=["-c", str(config)])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {pc.name: shlex.split(pc.command) for g in options.process_group_configs for pc in g.process_configs}


def _duplicate_ports(env: dict[str, str]) -> list[str]:
    """Two programs on one port: the second would fail at start, so say it before."""
    owners: list[tuple[str, int]] = [(k, int(v)) for k, v in env.items()
                                     if k.startswith("LOGJAM_") and k.endswith("_PORT") and v.isdigit()
                                     and k != "LOGJAM_IMPORTER_METRICS_PORT"]
    owners += [(f"{name} metrics", port) for name, port in metrics_ports(env).items() if name.startswith("logjam-importer-")]
    owners += [(f"device {k} {key}", device_port(env, key, k)) for k in range(1, device_count(env)) for key in DEVICE_PORTS]
    seen: dict[int, str] = {}
    problems = []
    for owner, port in owners:
        if port in seen:
            problems.append(f"port {port} is used twice: {seen[port]} and {owner}")
        seen.setdefault(port, owner)
    return problems


def check(config: Path, timeout: float = 180.0) -> int:
    """Run every program's command with --check (in parallel); 0 when all pass."""
    env = mesh_environment(config)
    ensure_keys(env)
    try:
        commands = program_commands(config, env)
    except SystemExit:  # supervisor printed why on stderr
        print(f"mesh check: {config} is not a valid supervisord config", flush=True)
        return 1
    problems = topology_problems(env) + _duplicate_ports(env)
    running = {name: subprocess.Popen([*argv, "--check"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
               for name, argv in commands.items()}
    failed = []
    for name, proc in running.items():
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n--check did not finish in {timeout:.0f}s"
        print(f"== {name}: {'ok' if proc.returncode == 0 else f'FAILED (exit {proc.returncode})'}")
        print("\n".join(f"   {line}" for line in out.rstrip().splitlines()), flush=True)
        if proc.returncode != 0:
            failed.append(name)
    for problem in problems:
        print(f"== mesh: {problem}")
    for warning in orphaned_journals(env):
        print(f"== mesh: {warning}")
    if failed or problems:
        print(f"mesh check FAILED: {', '.join(failed + (['mesh'] if problems else []))}", flush=True)
        return 1
    print(f"mesh check ok: {len(commands)} programs", flush=True)
    return 0


def ctl(config: Path, args: Sequence[str]) -> int:
    env = mesh_environment(config)
    return subprocess.call([_bin("supervisorctl"), "-c", str(config), *args], env=env)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.mesh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("action", choices=["up", "down", "status", "check"])
    p.add_argument("--config", default="supervisord.conf", type=Path)
    args = p.parse_args(argv)
    config = args.config.resolve()
    if args.action == "up":
        return up(config)
    if args.action == "status":
        return show_status(config)
    if args.action == "check":
        return check(config)
    return ctl(config, ["shutdown"])


if __name__ == "__main__":
    sys.exit(main())
