"""Chaos: `make up`'s mesh under steady Lumberjack load while its processes are killed and frozen at random.

Target (benchmarks/targets.toml): 0 lost, 0 doubled, 0 reader anomalies, make status healthy after. The mesh starts as in
benchmarks/e2e.py (the repository's supervisord.conf, CURVE, spare loopback ports, a temporary data
dir), the Lumberjack bridge taking each event's stream from `fields.app_env` (`--app-env-field`).
Every event has its own `@metadata._id` (`event_id`): connection * 10^10 + its number on it.
1. sealed: `chaos-sealed` gets --sealed-events events; the run waits until all are queryable;
2. load: --connections Lumberjack connections send --rate ev/s in all to --streams streams
   (`chaosNN-live`), stamped now and 24 h earlier (open-day and closing merges both run); a
   failed connection (or 60 s without an ack) reconnects and sends the unacknowledged rest
   again with the same ids, as Filebeat does;
3. chaos, for --minutes: every --interval s a kind (importer; Spark: logjam-spark or its JVM, its
   /proc child; device; bridge: the loaded Lumberjack one half the time), then one of its processes
   that ran --cooldown s since its start (Spark: since its port answered) and since its last hit,
   gets SIGKILL (supervisord restarts it) or SIGSTOP for --freeze-min..--freeze-max s, then SIGCONT.
   Every --compact-every s `logjam-sql --compact --older-than 0` runs. Twice a second a reader counts
   through Spark Connect the sealed stream (must stay exact) and --reader-streams live streams in
   turn (must never shrink); a failed query (a process down or frozen) is a reader error, not an
   anomaly;
4. drain (at most --drain-timeout): until every acknowledged id is queryable and the rows stop
   changing. Then: acknowledged, landed (distinct ids), lost, doubled (rows minus distinct ids, with
   what the copies share: one (device, seq), one device, or two devices, and whether a shipper
   resent them), what lies aside under the table dir (reported, not judged) and every /healthz, as
   `make status` asks. The chaos log is printed as it happens, restarts come from supervisord.log.
Exit status 1 when the target is missed. Frozen processes are always continued (also on Ctrl-C,
SIGTERM, SIGHUP); the mesh is torn down at the end.
Usage: python benchmarks/chaos.py [--minutes 10] [--interval 5] [--rate 2000] [--connections 4]
       [--streams 40] [--sealed-events 20000] [--seed N] [--drain-timeout 600] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import orjson
import pyarrow.compute as pc
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.cpu import children  # noqa: E402
from harness.mesh import Mesh  # noqa: E402
from bridges.lumberjack.engine import LumberjackClient  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402
from tools.mesh import DEFAULTS, health_report  # noqa: E402
from harness.processes import REPO, command, port_open  # noqa: E402
from benchmarks.results import Run  # noqa: E402

TARGET = "0 lost, 0 doubled, 0 reader anomalies, make status healthy after"
SEALED = "chaos-sealed"
OURS = "(app_env LIKE 'chaos%' OR original_app_env LIKE 'chaos%')"
ID_BASE = 10**10
KINDS = ("importer", "spark", "device", "bridge")
T0 = time.monotonic()  # the chaos's start: the log's times are from it
Run = tuple[int, int, float]  # first event id, count, when
_print_lock = threading.Lock()
# A query that fails while Spark is down is counted; pyspark's warning about it is noise here.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")


def say(text: str, at: float | None = None) -> None:
    with _print_lock:
        print(text if at is None else f"  {at - T0:+7.1f}s {text}", flush=True)


def chaos_config(dest: Path) -> Path:
    """supervisord.conf with absolute paths (it lives in `dest`), the Lumberjack bridge's stream from each event."""
    lines = (REPO / "supervisord.conf").read_text().replace("%(here)s", str(REPO)).splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith("command=") and "/logjam-bridge lumberjack " in line]
    if len(found) != 1:
        raise SystemExit("supervisord.conf has no single bridge-lumberjack command to add --app-env-field to")
    lines[found[0]] += " --app-env-field fields.app_env"
    (dest / "supervisord.conf").write_text("\n".join(lines) + "\n")
    return dest / "supervisord.conf"


def events(first: int, count: int, streams: Sequence[str]) -> list[bytes]:
    """Events first..first+count-1: stream by number; every other run of len(streams) stamped 24 h ago."""
    now = time.time()
    stamps = [time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t)) for t in (now, now - 86400)]
    return [orjson.dumps({"@timestamp": stamps[(n // len(streams)) % 2], "message": f"chaos event {eid} GET /a/{n % 97}",
                          "host": {"name": f"web-{n % 17}.example.net"}, "fields": {"app_env": streams[n % len(streams)]},
                          "@metadata": {"_id": str(eid)}})
            for eid in range(first, first + count) for n in [eid % ID_BASE]]


def ids(runs: list[Run]) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(f, f + c, dtype=np.int64) for f, c, _ in runs] or [np.zeros(0, np.int64)]))


class Shipper(threading.Thread):
    """One Lumberjack connection: a window every window/rate s; what fails is sent again (same ids) until acknowledged."""

    def __init__(self, conn: int, port: int, rate: float, window: int, streams: Sequence[str],
                 stop: threading.Event, limit: int | None = None) -> None:
        super().__init__(daemon=True, name=f"shipper-{conn}")
        self.conn, self.port, self.rate, self.window, self.streams = conn, port, rate, window, streams
        self.stop, self.limit = stop, limit
        self.finish_by = float("inf")  # once stopped: give up on what is still unacknowledged then
        self.acks: list[Run] = []     # acknowledged runs
        self.resends: list[Run] = []  # runs sent again after a failure
        self.sent = self.acked = self.unacked = self.connects = 0
        self.failures: Counter[str] = Counter()
        self.sock: socket.socket | None = None
        self.parser = LumberjackClient()  # reads acks; a new one per connection
        self.error: BaseException | None = None

    def run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self.stop.is_set() and (self.limit is None or self.sent < self.limit):
                if self.stop.wait(max(0.0, next_at - time.monotonic())):
                    break
                next_at += self.window / self.rate
                count = self.window if self.limit is None else min(self.window, self.limit - self.sent)
                first = self.conn * ID_BASE + self.sent + 1
                self.sent += count
                self.deliver(first, events(first, count, self.streams))
        except BaseException as e:  # reported by the main thread
            self.error = e
        finally:
            self.close()

    def deliver(self, first: int, payloads: list[bytes]) -> None:
        """Until acknowledged (or past finish_by); a failure (a killed or frozen bridge) reconnects, sends the rest again."""
        done, tries = 0, 0
        while done < len(payloads) and time.monotonic() <= self.finish_by:
            if tries:
                self.resends.append((first + done, len(payloads) - done, time.monotonic()))
            tries, got = tries + 1, 0
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    self.sock.settimeout(60)  # keepalive acks come every 2 s while the bridge runs
                    self.connects, self.parser = self.connects + 1, LumberjackClient()
                self.sock.sendall(LumberjackClient(compress_level=1, restart_each_window=True).send(payloads[done:]))
                while got < len(payloads) - done:
                    data = self.sock.recv(65536)
                    if not data:
                        raise ConnectionError("the bridge closed the connection")
                    got = max([got, *(a.seq for a in self.parser.feed(data))])
            except Exception as e:
                self.failures[type(e).__name__] += 1
                self.close()
                time.sleep(0.5)
            if got := min(got, len(payloads) - done):
                self.acks.append((first + done, got, time.monotonic()))
                self.acked, done = self.acked + got, done + got
        self.unacked += len(payloads) - done

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def programs(mesh: Mesh) -> dict[str, tuple[str, int, float]]:
    """Process name (without its group) -> (state, pid, uptime), from `supervisorctl status`."""
    out = subprocess.run([command("supervisorctl"), "-c", str(mesh.config), "status"], env=mesh.env,
                         capture_output=True, text=True, timeout=60).stdout
    procs = {}
    for parts in (line.split(None, 2) for line in out.splitlines()):
        if len(parts) >= 2 and parts[1].isupper():
            rest = parts[2] if len(parts) > 2 else ""
            pid = re.search(r"pid (\d+)", rest)
            up = re.search(r"uptime (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)", rest)
            uptime = (int(up[1] or 0) * 86400 + int(up[2]) * 3600 + int(up[3]) * 60 + int(up[4])) if up else 0.0
            procs[parts[0].split(":")[-1]] = (parts[1], int(pid[1]) if pid else 0, uptime)
    return procs


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the name: [0] the state, [19] the start time (with the pid, one process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def jvm_of(pid: int) -> int | None:
    """logjam-spark's JVM: its child (or grandchild) named java."""
    for child in children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                return child
    return None


class Chaos:
    """Kills and freezes; remembers what it froze, so that everything is continued whatever happens."""

    def __init__(self, mesh: Mesh, rng: random.Random, args: argparse.Namespace) -> None:
        self.mesh, self.rng, self.args = mesh, rng, args
        self.frozen: dict[int, tuple[list[str], str, str, float, float]] = {}  # pid -> (stat, label, program, since, until)
        self.last_hit: dict[str, float] = {}
        self.log: list[tuple[float, str]] = []
        self.kills: Counter[str] = Counter()
        self.stops: Counter[str] = Counter()
        self.actions = self.idle = 0
        self.spark_up_since: float | None = None  # since when the Connect port answers

    def note(self, text: str) -> None:
        self.log.append((time.monotonic(), text))
        say(text, time.monotonic())

    def targets(self) -> dict[str, list[tuple[str, str, int, float]]]:
        """Kind -> [(label, program, pid, weight)] of the processes that may be hit now."""
        now, procs, out = time.monotonic(), programs(self.mesh), defaultdict(list)
        busy = {program for _, _, program, _, _ in self.frozen.values()}
        self.spark_up_since = (self.spark_up_since or now) if port_open(int(self.mesh.env["LOGJAM_SPARK_PORT"])) else None
        spark_up = self.spark_up_since is not None and now - self.spark_up_since >= self.args.cooldown
        bridges = sum(1 for n in procs if n.startswith("bridge-"))
        for name, (state, pid, uptime) in procs.items():
            if (state != "RUNNING" or not pid or uptime < self.args.cooldown or name in busy
                    or now - self.last_hit.get(name, -1e9) < self.args.cooldown):
                continue
            if name == "logjam-spark" and spark_up:
                out["spark"] += [(name, name, pid, 1.0)] + [(f"{name} JVM", name, jvm, 1.0) for jvm in [jvm_of(pid)] if jvm]
            elif name.startswith(("logjam-importer", "logjam-device")):
                out["importer" if "importer" in name else "device"].append((name, name, pid, 1.0))
            elif name.startswith("bridge-"):  # the loaded one half the time
                out["bridge"].append((name, name, pid, max(1, bridges - 1) if name == "bridge-lumberjack" else 1.0))
        return out

    def act(self) -> None:
        targets = self.targets()
        kinds = [k for k in KINDS if targets.get(k)]
        if not kinds:
            self.idle += 1
            return
        group = targets[self.rng.choice(kinds)]
        label, program, pid, _ = self.rng.choices(group, weights=[t[3] for t in group])[0]
        self.actions += 1
        self.last_hit[program] = time.monotonic()
        try:
            if self.rng.random() < self.args.kill_share:
                os.kill(pid, signal.SIGKILL)
                self.kills[label] += 1
                self.note(f"KILL {label} (pid {pid})")
            else:
                seconds = self.rng.uniform(self.args.freeze_min, self.args.freeze_max)
                # Noted before it is sent: whatever interrupts us now, thaw() continues it.
                self.frozen[pid] = (proc_stat(pid)[19:20], label, program, time.monotonic(), time.monotonic() + seconds)
                os.kill(pid, signal.SIGSTOP)
                self.stops[label] += 1
                self.note(f"STOP {label} (pid {pid}) for {seconds:.0f} s")
        except ProcessLookupError:
            self.frozen.pop(pid, None)
            self.note(f"gone before it was hit: {label} (pid {pid})")

    def thaw(self, everything: bool = False) -> None:
        """SIGCONT what is due (or everything), if it is still the process that was stopped."""
        now = time.monotonic()
        for pid, (start, label, _, at, until) in list(self.frozen.items()):
            if everything or now >= until:
                del self.frozen[pid]
                try:
                    if not start or proc_stat(pid)[19:20] != start:
                        raise ProcessLookupError
                    os.kill(pid, signal.SIGCONT)
                    self.note(f"CONT {label} (pid {pid}) after {now - at:.0f} s")
                except ProcessLookupError:
                    self.note(f"gone while stopped: {label} (pid {pid})")


class Spark:
    """A Connect session that gives up within about a second on a server that is down, made anew after a failure."""

    def __init__(self, url: str) -> None:
        self.url, self.session = url, None

    def run(self, fn: Callable[[Any], Any]) -> Any:
        if self.session is None:
            from pyspark.sql import SparkSession
            from pyspark.sql.connect.client.retries import DefaultPolicy

            self.session = SparkSession.builder.remote(self.url).create()
            self.session.client.set_retry_policies([DefaultPolicy(max_retries=3, max_backoff=1000)])
        try:
            return fn(self.session)
        except Exception:
            self.close()  # a restarted server does not know the session
            raise

    def rows(self, sql: str) -> list[Any]:
        return self.run(lambda s: s.sql(sql).collect())

    def close(self) -> None:
        session, self.session = self.session, None
        try:
            if session is not None:
                session.stop()
        except Exception:  # best effort: the server may be gone
            pass


def first_line(e: BaseException) -> str:
    m = re.search(r'details = "([^"]*)"', str(e)) or re.search(r"(\S.*)", str(e))
    return f"{type(e).__name__}: {m[1][:110] if m else ''}"


class Reader(threading.Thread):
    """Twice a second, counts the sealed stream and `per_read` live streams in turn (a count over all of them
    reads every live file: 25 s a read on a busy 2-core machine). A sealed count that changes, or a live one
    that shrinks since its last read, is an anomaly."""

    def __init__(self, url: str, sealed_rows: int, streams: list[str], per_read: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="reader")
        self.spark, self.sealed_rows, self.stop = Spark(url), sealed_rows, stop
        self.streams, self.per_read = streams, max(1, min(per_read, len(streams)))
        self.errors = 0
        self.took: list[float] = []  # seconds per successful read
        self.error_kinds: Counter[str] = Counter()
        self.anomalies: list[tuple[float, str]] = []
        self.last: dict[str, int] = {}

    def run(self) -> None:
        next_at, k = time.monotonic(), 0
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            t0 = time.monotonic()
            next_at = t0 + 0.5
            chunk = [self.streams[(k + i) % len(self.streams)] for i in range(self.per_read)]
            k += self.per_read
            names = ", ".join(f"'{s}'" for s in [SEALED, *chunk])
            try:
                counts = {r[0]: int(r[1]) for r in self.spark.rows(
                    f"SELECT app_env, count(*) FROM logjam.messages WHERE app_env IN ({names}) GROUP BY app_env")}
            except Exception as e:  # a killed or restarting Spark: counted, not an anomaly
                self.errors += 1
                self.error_kinds[first_line(e)] += 1
                continue
            self.took.append(time.monotonic() - t0)
            found = [] if counts.get(SEALED, 0) == self.sealed_rows else [
                f"sealed {SEALED}: {counts.get(SEALED, 0)} rows, not {self.sealed_rows}"]
            found += [f"{stream} shrank from {self.last[stream]} to {counts.get(stream, 0)} rows"
                      for stream in chunk if counts.get(stream, 0) < self.last.get(stream, 0)]
            self.last.update({stream: counts.get(stream, 0) for stream in chunk})
            for text in found:
                self.anomalies.append((time.monotonic(), text))
                say(f"READER ANOMALY: {text}", time.monotonic())
        self.spark.close()


class Compactor(threading.Thread):
    """`logjam-sql --compact --older-than 0` against the mesh every `every` s, one at a time."""

    def __init__(self, mesh: Mesh, every: float, note: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name="compactor")
        self.mesh, self.every, self.stop, self.note = mesh, every, threading.Event(), note
        self.proc: subprocess.Popen | None = None
        self.runs: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            t0, argv = time.monotonic(), [command("logjam-sql"), "--spark", self.mesh.url, "--compact", "--older-than", "0"]
            self.proc = subprocess.Popen(argv, env=self.mesh.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
            try:
                out = self.proc.communicate(timeout=300)[0].strip().splitlines() or [""]
            except subprocess.TimeoutExpired:
                out = ["no answer in 300 s"]
                self.abort()
            code = self.proc.returncode
            self.runs["ok" if code == 0 else "failed"] += 1
            self.note(f"compact: {'ok' if code == 0 else f'FAILED ({code}): {out[-1][:120]}'} in {time.monotonic() - t0:.1f} s")

    def abort(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # our own child, by its pid
            self.proc.wait()


def landed(spark: Spark, where: str, want: int, timeout: float) -> tuple[int, int]:
    """(rows, distinct ids) once at least `want` distinct ids are found and the rows stopped changing, or after `timeout`."""
    t0, last = time.monotonic(), -1
    while True:
        try:
            rows, distinct = spark.rows(f"SELECT count(*), count(DISTINCT event_id) FROM logjam.messages WHERE {where}")[0]
            if distinct >= want and rows == last or time.monotonic() - t0 > timeout:
                return int(rows), int(distinct)
            last = rows
        except Exception as e:  # Spark restarting
            say(f"  waiting for the rows: {first_line(e)}")
            if time.monotonic() - t0 > timeout + 120:
                return -1, -1
        time.sleep(3)


def seal(spark: Spark, port: int, args: argparse.Namespace) -> tuple[Shipper, int]:
    """Send the sealed stream and wait until all of it is queryable; its row count."""
    shipper = Shipper(0, port, args.rate, args.window, [SEALED], threading.Event(), limit=args.sealed_events)
    shipper.start()
    shipper.join(600)
    if shipper.error or shipper.acked < args.sealed_events:
        raise SystemExit(f"sealed stream: {shipper.acked} of {args.sealed_events} acknowledged ({shipper.error!r})")
    rows, distinct = landed(spark, f"app_env = '{SEALED}'", shipper.acked, 300)
    if distinct < shipper.acked:
        raise SystemExit(f"sealed stream: {distinct} of {shipper.acked} events queryable after 300 s")
    return shipper, rows


def tally(spark: Spark, acked: np.ndarray, timeout: float) -> tuple[Any, float]:
    """Wait for every acknowledged id (or the timeout). ((found ids, their rows, rows without an id, rows under
    a stand-in app_env), seconds waited)."""
    t0 = time.monotonic()
    while True:
        landed(spark, OURS, len(acked), max(0.0, timeout - (time.monotonic() - t0)))
        try:
            table = spark.run(lambda s: s.sql(
                f"SELECT try_cast(event_id AS BIGINT) AS id, count(*) AS n, sum(CASE WHEN app_env LIKE 'chaos%' THEN 0 "
                f"ELSE 1 END) AS moved FROM logjam.messages WHERE {OURS} GROUP BY 1").toArrow())
        except Exception as e:
            say(f"  counting: {first_line(e)}")
            table = None
        if table is not None:
            valid = pc.is_valid(table.column("id"))
            found, n = (pc.filter(table.column(c), valid).to_numpy().astype(np.int64) for c in ("id", "n"))
            if np.isin(acked, found).all() or time.monotonic() - t0 > timeout:
                no_id = int(pc.sum(pc.filter(table.column("n"), pc.invert(valid))).as_py() or 0)
                return (found, n, no_id, int(pc.sum(table.column("moved")).as_py() or 0)), time.monotonic() - t0
        elif time.monotonic() - t0 > timeout + 120:
            return None, time.monotonic() - t0
        time.sleep(5)


def doubles(spark: Spark, resent: np.ndarray) -> tuple[Counter[str], list[str]]:
    """What the copies of each doubled id share, and a few examples with the files they are in."""
    rows = spark.rows(
        f"SELECT t.event_id, t.device, t.journal, t.seq, t._metadata.file_path FROM logjam.messages t "
        f"JOIN (SELECT event_id FROM logjam.messages WHERE {OURS} GROUP BY 1 HAVING count(*) > 1 LIMIT 20000) d "
        f"ON t.event_id = d.event_id")
    copies: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        copies[r[0]].append(r)
    kinds: Counter[str] = Counter()
    examples: list[str] = []
    for eid, group in sorted(copies.items()):
        if len({(r[1], r[2], r[3]) for r in group}) < len(group):
            kind = "one message (device, seq) written twice"
        elif len({(r[1], r[2]) for r in group}) == 1:
            kind = "journaled twice by one device, not deduplicated"
        else:
            kind = "copies from two devices"
        kind += ", among what a shipper resent" if np.isin(int(eid), resent) else ", never resent by a shipper"
        kinds[kind] += len(group) - 1
        if sum(1 for e in examples if e.startswith(kind)) < 2:
            where = "; ".join(f"device {r[1]} seq {r[3]} in {r[4].split('/messages/', 1)[-1]}" for r in group)
            examples.append(f"{kind}: id {eid}: {where}")
    return kinds, examples


def disk_left(table_dir: Path, data: Path) -> dict[str, list[tuple[Path, int]]]:
    """What lies under the table dir besides the files the Delta log's current version names: kind -> [(path, bytes)].

    Files the log removed (a compaction's inputs, a retention's days) wait there for VACUUM; a
    file no version ever named is what a killed writer left before its commit. Both are
    invisible to every reader, and VACUUM deletes them after its grace."""
    found: dict[str, list[tuple[Path, int]]] = defaultdict(list)
    table = DeltaTable(str(table_dir))
    live = {Path(urllib.parse.unquote(u.removeprefix("file://"))) for u in table.file_uris()}
    for f in table_dir.rglob("*.parquet"):
        if "_delta_log" in f.parts or f in live:
            continue
        with contextlib.suppress(OSError):  # VACUUM may delete it meanwhile
            found["files the log does not name (awaiting VACUUM, or a killed writer's)"].append((f, f.stat().st_size))
    for app_dir in table_dir.glob("app_env=*"):
        if not any(f.is_file() for f in app_dir.glob("date=*/*")):
            found["empty app_env= dirs"].append((app_dir, 0))
    return found


def restarts(log: Path) -> dict[str, tuple[int, Counter[str]]]:
    """Program -> (restarts, why it exited), from supervisord.log."""
    spawns: Counter[str] = Counter()
    exits: dict[str, Counter[str]] = defaultdict(Counter)
    for line in log.read_text(errors="replace").splitlines():
        if m := re.search(r"spawned: '([^']+)' with pid", line):
            spawns[m[1]] += 1
        elif m := re.search(r"exited: (\S+) \((.*)\)", line):
            exits[m[1]][m[2].replace("; not expected", "")] += 1
        elif m := re.search(r"gave up: (\S+) entered FATAL", line):
            exits[m[1]]["FATAL: gave up"] += 1
    return {name: (n - 1, exits[name]) for name, n in sorted(spawns.items())}


def healthy_after(mesh: Mesh, wait: float = 60.0) -> tuple[bool, float, list[str]]:
    """As `make status`: every program RUNNING and every /healthz healthy; asked for up to `wait` s."""
    t0 = time.monotonic()
    while True:
        procs = programs(mesh)
        ok, lines = health_report(mesh.env)
        lines = [f"  {n:<20} {state}" for n, (state, _, _) in procs.items() if state != "RUNNING"] + lines
        ok = ok and bool(procs) and all(state == "RUNNING" for state, _, _ in procs.values())
        if ok or time.monotonic() - t0 > wait:
            return ok, time.monotonic() - t0, lines
        time.sleep(5)


def report_rows(shippers: list[Shipper], result: Any, drained: float, chaos: Chaos, spark: Spark) -> tuple[int, int]:
    acked, resent = ids([a for s in shippers for a in s.acks]), ids([r for s in shippers for r in s.resends])
    print(f"  acknowledged  {len(acked):>10,}  (sent {sum(s.sent for s in shippers):,}; "
          f"{sum(s.unacked for s in shippers):,} never acknowledged; {len(resent):,} sent again, "
          f"{sum(s.connects for s in shippers) - len(shippers)} reconnects after "
          f"{dict(sum((s.failures for s in shippers), Counter()))})")
    if result is None:
        print("  the table never answered after the chaos: nothing counted")
        return len(acked), -1
    found_ids, counts, no_id, moved = result
    found = np.isin(acked, found_ids)
    lost, doubled = int((~found).sum()), int(counts.sum() - len(counts))
    print(f"  landed        {len(found_ids):>10,}  distinct ids ({int(counts.sum()) + no_id:,} rows; "
          f"{len(found_ids) - int(found.sum()):,} never acknowledged; {no_id} rows without an id; {moved} under a "
          f"stand-in app_env); drained {drained:.0f} s after the chaos")
    print(f"  lost          {lost:>10,}  target 0  {'ok' if lost == 0 else 'MISSED'}")
    for eid in acked[~found][:5]:
        at = next(t for s in shippers for f, c, t in s.acks if f <= eid < f + c)
        near = "; ".join(text for t, text in chaos.log if at - 40 <= t <= at + 2)
        print(f"    id {eid} (connection {eid // ID_BASE}) acknowledged at {at - T0:+.1f}s"
              f"{', resent' if np.isin(eid, resent) else ''}; chaos in the 40 s before: {near or 'none'}")
    print(f"  doubled       {doubled:>10,}  target 0  {'ok' if doubled == 0 else 'MISSED'}")
    try:
        kinds, examples = doubles(spark, resent) if doubled else (Counter(), [])
    except Exception as e:
        kinds, examples = Counter(), [f"no breakdown: {first_line(e)}"]
    print("".join(f"    {n:,} extra rows: {kind}\n" for kind, n in kinds.most_common())
          + "".join(f"    e.g. {text}\n" for text in examples), end="")
    resends = sorted((r for s in shippers for r in s.resends), key=lambda r: r[2])
    when = Counter(next((t for f, c, t in resends if f <= eid < f + c), None) for eid in found_ids[counts > 1][:20000])
    for t, n in sorted(when.items(), key=lambda kv: kv[0] or 0.0):
        near = "; ".join(text for at, text in chaos.log if t is not None and t - 15 <= at <= t)
        print(f"    {n:,} doubled ids " + (f"first sent again at {t - T0:+.1f}s; chaos in the 15 s before: {near or 'none'}"
                                          if t is not None else "never sent again by a shipper"))
    return lost, doubled


def report(args: argparse.Namespace, mesh: Mesh, chaos: Chaos, reader: Reader, compactor: Compactor,
           shippers: list[Shipper], result: Any, drained: float, spark: Spark, record: Run) -> bool:
    print(f"\nchaos benchmark: {args.devices} devices, {args.importers} importers, {args.streams} live streams + {SEALED}, "
          f"{args.connections} Lumberjack connections at {args.rate:,.0f} ev/s, events stamped now and 24 h earlier; "
          f"{args.minutes:g} min of chaos, an action every {args.interval:g} s (seed {args.seed})")
    print(f"  chaos: {chaos.actions} actions ({sum(chaos.kills.values())} SIGKILL, {sum(chaos.stops.values())} SIGSTOP "
          f"{args.freeze_min:g}-{args.freeze_max:g} s; {chaos.idle} times nothing eligible); logjam-sql --compact: "
          f"{dict(compactor.runs)}\n  per program: our kills/stops; restarts and exit causes from supervisord.log")
    for name, (n, why) in restarts(Path(mesh.env["LOGJAM_DATA_DIR"], "logs", "supervisord.log")).items():
        jvm = f"{name} JVM"
        ours = f"{chaos.kills[name]}/{chaos.stops[name]}"
        ours += f", JVM {chaos.kills[jvm]}/{chaos.stops[jvm]}" if name == "logjam-spark" else ""
        print(f"    {name:<18} {ours:<14} restarts {n}: " + (", ".join(f"{k} x{v}" for k, v in why.items()) or "-"))
    lost, doubled = report_rows(shippers, result, drained, chaos, spark)
    anomalies, took = len(reader.anomalies), sorted(reader.took) or [0.0]
    print(f"  reader anomalies {anomalies:>7,}  target 0  {'ok' if anomalies == 0 else 'MISSED'}  ({len(reader.took):,} "
          f"reads of the sealed and {reader.per_read} live streams, {took[len(took) // 2]:.1f} s median, {took[-1]:.1f} s "
          f"longest; {reader.errors:,} reader errors; sealed stream {reader.sealed_rows:,} rows)")
    print("".join(f"    {t - T0:+.1f}s {text}\n" for t, text in reader.anomalies[:10])
          + "".join(f"    reader error x{n}: {text}\n" for text, n in reader.error_kinds.most_common(5)), end="")
    healthy, waited, lines = healthy_after(mesh)
    print(f"  make status   {'healthy' if healthy else 'UNHEALTHY':>10}  target healthy  {'ok' if healthy else 'MISSED'}"
          f"  (asked for {waited:.0f} s)" + "".join(f"\n{line}" for line in ([] if healthy else lines)))
    data = Path(mesh.env["LOGJAM_DATA_DIR"])
    left = disk_left(data / "warehouse" / "messages", data)
    for _ in range(3):  # what a maintenance pass or a write in progress has out is gone a little later
        time.sleep(20 if left else 0)
        there = {p for items in disk_left(data / "warehouse" / "messages", data).values() for p, _ in items}
        left = {kind: kept for kind, items in left.items() if (kept := [(p, b) for p, b in items if p in there])}
    print("  disk left aside, still there 60 s later (reported, not judged): " + ("nothing" if not left else "") + "".join(
        f"\n    {kind}: {len(items)}, {sum(b for _, b in items):,} bytes, e.g. "
        + ", ".join(str(p.relative_to(data)) for p, _ in items[:3]) for kind, items in left.items()))
    ok = lost == 0 and doubled == 0 and anomalies == 0 and healthy
    print(f"target \"{TARGET}\": {'met' if ok else 'MISSED'}", flush=True)
    record.check("lost", lost)
    record.check("doubled", doubled if doubled >= 0 else float("nan"))  # -1: the table never answered
    record.check("reader_anomalies", anomalies)
    record.check("healthy_after", healthy)
    record.figure("chaos actions", chaos.actions)
    record.figure("acknowledged", len(ids([a for s in shippers for a in s.acks])), "events")
    record.save()
    return ok


def run(mesh: Mesh, args: argparse.Namespace, record: Run) -> bool:
    spark, port = Spark(mesh.url), int(mesh.env["LOGJAM_LUMBERJACK_PORT"])
    stop_load, stop_reader = threading.Event(), threading.Event()
    chaos = Chaos(mesh, random.Random(args.seed), args)
    compactor = Compactor(mesh, args.compact_every, chaos.note)
    try:
        sealed, sealed_rows = seal(spark, port, args)
        say(f"sealed: {sealed_rows:,} rows of {SEALED} queryable ({sealed.acked:,} events acknowledged)")
        streams = [f"chaos{k:02d}-live" for k in range(args.streams)]
        shippers = [Shipper(c + 1, port, args.rate / args.connections, args.window, streams, stop_load)
                    for c in range(args.connections)]
        reader = Reader(mesh.url, sealed_rows, streams, args.reader_streams, stop_reader)
        for thread in (*shippers, reader):
            thread.start()
        time.sleep(args.warmup)
        chaos_phase(chaos, compactor, args, lambda: f"acknowledged {sum(s.acked for s in shippers):,}; reads "
                    f"{len(reader.took)} ({reader.errors} errors); anomalies {len(reader.anomalies)}")
        stop_load.set()
        stop_reader.set()
        for s in shippers:
            s.finish_by = time.monotonic() + 180
        for thread in (*shippers, reader, compactor):
            thread.join(320)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all(state == "RUNNING" for state, _, _ in programs(mesh).values()):
            time.sleep(2)
        result, drained = tally(spark, ids([a for s in (sealed, *shippers) for a in s.acks]), args.drain_timeout)
        return report(args, mesh, chaos, reader, compactor, [sealed, *shippers], result, drained, spark, record)
    finally:
        stop_load.set()
        stop_reader.set()
        compactor.stop.set()
        compactor.abort()
        spark.close()


def chaos_phase(chaos: Chaos, compactor: Compactor, args: argparse.Namespace, progress: Callable[[], str]) -> None:
    """--minutes of chaos, at most one action per --interval; however it ends, every stopped process is continued."""
    global T0
    T0 = time.monotonic()
    say(f"chaos for {args.minutes:g} min, seed {args.seed} (times from now):")
    compactor.start()
    end, cap = T0 + args.minutes * 60, int(args.minutes * 60 / args.interval)  # bounded in time and in count
    next_act, next_report = T0 + args.interval, T0 + 60
    try:
        while time.monotonic() < end and chaos.actions < cap:
            chaos.thaw()
            if time.monotonic() >= next_act:
                chaos.act()
                next_act += args.interval
            if time.monotonic() >= next_report:
                say(progress(), time.monotonic())
                next_report += 60
            time.sleep(0.2)
    finally:
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            chaos.thaw(everything=True)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            compactor.stop.set()
    say("chaos over; the shippers finish their windows, the mesh drains", time.monotonic())


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default, text in [
            ("--minutes", float, 10, "how long the chaos lasts"), ("--interval", float, 5, "seconds between two actions"),
            ("--kill-share", float, 0.5, "share of the actions that SIGKILL; the others SIGSTOP"),
            ("--freeze-min", float, 10, "shortest SIGSTOP, s"), ("--freeze-max", float, 30, "longest SIGSTOP, s"),
            ("--cooldown", float, 30, "a process is hit only once it ran this long since its start and its last hit, s"),
            ("--compact-every", float, 60, "seconds between two logjam-sql --compact --older-than 0"),
            ("--rate", float, 2000, "ev/s of all connections together"), ("--connections", int, 4, "Lumberjack connections"),
            ("--window", int, 250, "events per Lumberjack window"), ("--streams", int, 40, "live streams (app-envs)"),
            ("--sealed-events", int, 20000, "events of the sealed stream"),
            ("--reader-streams", int, 4, "live streams each read counts besides the sealed one, in turn"),
            ("--warmup", float, 15, "seconds of load before the chaos"),
            ("--drain-timeout", float, 600, "seconds to wait for every acknowledged event after the chaos"),
            ("--devices", int, int(DEFAULTS["LOGJAM_DEVICES"]), "devices"),
            ("--importers", int, int(DEFAULTS["LOGJAM_IMPORTERS"]), "importers"),
            ("--seed", int, None, "of the chaos's choices (default: random, printed)")]:
        ap.add_argument(flag, type=kind, default=default, help=text + ("" if default is None else " (default %(default)s)"))
    ap.add_argument("--keep", action="store_true", help="keep the data dir (logs, table) and print where it is")
    args = ap.parse_args()
    args.seed = random.randrange(10**6) if args.seed is None else args.seed
    if not 0 < args.freeze_min <= args.freeze_max or args.interval <= 0 or args.minutes <= 0:
        ap.error("needs 0 < --freeze-min <= --freeze-max, --interval > 0 and --minutes > 0")
    return args


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    args = parse_args()
    record = Run("chaos")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-chaos-"))
    t0, mesh = time.monotonic(), None
    try:
        mesh = Mesh(base / "data", args.devices, args.importers, config=chaos_config(base))
        mesh.spark.stop()  # ours give up sooner on a server that is down (Spark above)
        mesh.spark = None
        say(f"mesh up in {time.monotonic() - t0:.0f} s; data in {base / 'data'}")
        ok = run(mesh, args, record)
        print(f"  total run time {time.monotonic() - t0:.0f} s")
        return 0 if ok else 1
    except KeyboardInterrupt as e:
        say(f"interrupted ({e or 'Ctrl-C'}); every stopped process was continued; tearing the mesh down")
        return 130
    except SystemExit as e:  # a phase that cannot go on says why
        say(f"stopped: {e}")
        return 2
    except Exception:
        traceback.print_exc()
        return 2
    finally:
        if mesh is not None:
            mesh.shutdown()
        else:  # Mesh() failed after supervisord started: stop that by its pid file
            with contextlib.suppress(OSError, ValueError):
                pid = int((base / "data" / "supervisord.pid").read_text())
                os.kill(pid, signal.SIGTERM)
                for _ in range(120):
                    if proc_stat(pid)[:1] in ([], ["Z"]):
                        break
                    time.sleep(1)
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
