"""Fairness: one loud stream must not take a quiet stream's freshness.

The scenario of benchmarks/fairness.py (its docstring tells the phases and what is measured), which
tests/test_mesh_fairness.py runs with smaller numbers: the quiet and the loud stream, the lag
sampler, the phases (`measure`), the printed report and the command-line flags (`parser`). Its
targets are benchmarks/targets.toml's [fairness], read as a file (harness/ imports no benchmark).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from deltalake import DeltaTable

from harness.lumberjack_load import WINDOW, Shipper, ship, windows
from harness.cpu import cpu
from harness.mesh import Mesh
from harness.processes import wait_for
from logjam.producer import Producer
from tools.mesh import device_endpoint, device_port

QUIET = "quiet-prod"
LOUD = "lumberjack-default"  # the Lumberjack bridge's app-env in make up's mesh
_TARGETS = tomllib.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "targets.toml").read_text())["fairness"]
TARGETS = {"p50": _TARGETS["quiet_p50"]["max"], "worst": _TARGETS["quiet_worst"]["max"],
           "share": _TARGETS["flood_share"]["min"]}


@dataclass
class Lags:
    """(time, lag) samples of the quiet stream, taken while `phase` is set."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def summary(self, phase: str) -> tuple[float, float, int]:
        got = sorted(self.samples.get(phase, []))
        if not got:
            return float("nan"), float("nan"), 0
        return got[len(got) // 2], got[-1], len(got)


class Quiet(threading.Thread):
    """`quiet-prod` at `rate` ev/s to one device's ROUTER; event n carries {"n": n}; send times kept."""

    def __init__(self, endpoint: str, rate: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.rate, self.stop = endpoint, rate, stop
        self.sent_at: list[float] = []
        self.accepted = 0
        self.error: BaseException | None = None
        self.paused = threading.Event()  # set: send nothing (the flood-alone phases)

    def run(self) -> None:
        try:
            producer = Producer(self.endpoint, timeout=120.0)
            next_at = time.perf_counter()
            while not self.stop.is_set():
                if self.paused.is_set():
                    self.stop.wait(0.05)
                    next_at = time.perf_counter()
                    continue
                time.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += 1.0 / self.rate
                n = len(self.sent_at)
                self.sent_at.append(time.perf_counter())
                producer.submit(QUIET, "logs.quiet", {"n": n, "message": f"quiet event {n}"})
            self.accepted = producer.flush().accepted
            producer.close()
        except BaseException as e:  # reported by the main thread
            self.error = e


class Sampler(threading.Thread):
    """About once a second: the newest committed quiet event's age, filed under the current phase.

    It reads the table's log with delta-rs, which sees a commit as soon as it is made: the
    mesh's landing, apart from the time a Spark reader takes to bring its own snapshot up to
    date. The age is taken at the moment the snapshot was read."""

    REOPEN_EVERY = 100  # a snapshot brought forward for ever grows what each update walks

    def __init__(self, mesh: Mesh, quiet: Quiet, lags: Lags, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.mesh, self.quiet, self.lags, self.stop = mesh, quiet, lags, stop
        self.phase = ""
        self.location = f"{mesh.env['LOGJAM_DATA_DIR']}/warehouse/messages"
        self._table: DeltaTable | None = None
        self._reads = 0

    def newest(self) -> tuple[int | None, float]:
        """(the highest quiet event number committed, perf_counter() when the snapshot was taken)."""
        if self._table is None or self._reads % self.REOPEN_EVERY == 0:
            self._table = DeltaTable(self.location)
        else:
            self._table.update_incremental()
        self._reads += 1
        at = time.perf_counter()
        bodies = self._table.to_pyarrow_table(columns=["body"], filters=[("app_env", "=", QUIET)]).column("body")
        numbers = [orjson.loads(b)["n"] for b in bodies.to_pylist() if b]
        return (max(numbers) if numbers else None), at

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                n, at = self.newest()
            except Exception as e:  # a read failing under load (or before the table exists) is a missed sample
                print(f"  (lag read failed: {e})", flush=True)
                n, at = None, started
            phase = self.phase
            if phase and n is not None and n < len(self.quiet.sent_at):
                self.lags.samples.setdefault(phase, []).append(at - self.quiet.sent_at[n])
            self.stop.wait(max(0.0, 1.0 - (time.perf_counter() - started)))


# Where the quiet stream's lag goes: importer 0's commits (count, seconds, rows) and the seconds
# device 0 held its input for the importers (--max-importer-lag), as counters read around a phase.
WATCH = ("logjam_importer_write_seconds_count", "logjam_importer_write_seconds_sum", "logjam_importer_batch_rows_sum",
         "logjam_device_input_held_seconds_total", "logjam_device_fair_parked_seconds_total",
         "logjam_device_fair_longest_park_seconds")


def scrape(mesh: Mesh, k: int = 0) -> dict[str, float]:
    """The WATCH counters of importer k and device k (their /metrics)."""
    out: dict[str, float] = {}
    for port in (int(mesh.env["LOGJAM_IMPORTER_METRICS_PORT"]) + k, device_port(mesh.env, "LOGJAM_DEVICE_METRICS_PORT", k)):
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in WATCH:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def describe_jobs(before: list[dict[str, float]], after: list[dict[str, float]], seconds: float) -> str:
    lines = []
    for k, (b, a) in enumerate(zip(before, after)):
        d = {name: a.get(name, 0.0) - b.get(name, 0.0) for name in WATCH}
        jobs = max(d["logjam_importer_write_seconds_count"], 1.0)
        lines.append(f"importer {k}: {d['logjam_importer_write_seconds_count']:.0f} commits, "
                     f"{d['logjam_importer_write_seconds_sum'] / jobs:.2f} s and "
                     f"{d['logjam_importer_batch_rows_sum'] / jobs:,.0f} rows each; device {k} past the hard lag limit "
                     f"{d['logjam_device_input_held_seconds_total']:.1f} s, parked the loud stream "
                     f"{d['logjam_device_fair_parked_seconds_total']:.1f} s of {seconds:.0f} s (longest park so far "
                     f"{a.get('logjam_device_fair_longest_park_seconds', 0.0):.1f} s)")
    return "\n    ".join(lines)


def quiet_rows(mesh: Mesh) -> tuple[int, int]:
    row = mesh.spark.sql(f"SELECT count(*), count(DISTINCT variant_get(doc, '$.n', 'bigint')) FROM logjam.messages "
                         f"WHERE app_env = '{QUIET}'").collect()[0]
    return int(row[0]), int(row[1])


def flood(mesh: Mesh, port: int, args: argparse.Namespace, pools: list[list[bytes]], seconds: float) -> dict:
    """The loud stream as fast as acknowledged for `seconds`; then wait until it drained."""
    stop = threading.Event()
    pids = {**mesh.pids(), "this benchmark": [os.getpid()]}
    rows0, t0, m0, cpu0 = mesh.rows(), time.perf_counter(), [scrape(mesh, 0), scrape(mesh, 1)], cpu(pids)
    shippers = [Shipper(port, pools[c], WINDOW, stop) for c in range(args.connections)]
    ship(shippers, seconds, stop)
    rows_at_end, t_end, m1, cpu1 = mesh.rows(), time.perf_counter(), [scrape(mesh, 0), scrape(mesh, 1)], cpu(pids)
    cores = {name: (cpu1[name] - cpu0[name]) / (t_end - t0) for name in cpu1}
    acked = sum(s.acked for s in shippers)
    deadline = time.monotonic() + 300
    while mesh.rows() < rows0 + acked and time.monotonic() < deadline:
        time.sleep(0.5)
    return {"acked": acked, "elapsed": t_end - t0, "landed": rows_at_end - rows0,
            "drain": time.perf_counter() - max(s.last_ack for s in shippers), "jobs": describe_jobs(m0, m1, t_end - t0),
            "cores": ", ".join(f"{name} {c:.2f}" for name, c in sorted(cores.items(), key=lambda kv: -kv[1]) if c >= 0.01)}


@dataclass
class Result:
    lags: Lags
    shared: dict
    alone: list[dict]  # the flood-alone phases before and after the shared one
    quiet: tuple[int, int, int]  # acknowledged, rows, distinct
    loud: tuple[int, int, int]

    def lost_or_doubled(self) -> int:
        return sum(max(0, acked - distinct) + rows - distinct for acked, rows, distinct in (self.quiet, self.loud))

    def reference(self) -> dict | None:
        """The flood alone at its best: the phase that landed more."""
        return max(self.alone, key=lambda a: a["landed"] / a["elapsed"], default=None)


def measure(mesh: Mesh, args: argparse.Namespace) -> Result:
    """Warm-up, flood alone, quiet alone, flood + quiet, flood alone (see benchmarks/fairness.py); all landed."""
    port = int(mesh.env["LOGJAM_LUMBERJACK_PORT"])
    pools = [windows(c, 16) for c in range(args.connections)]
    stop, sampled, lags = threading.Event(), threading.Event(), Lags()
    quiet = Quiet(device_endpoint(mesh.env, "router", 0), args.quiet_rate, stop)
    sampler = Sampler(mesh, quiet, lags, sampled)
    quiet.start()
    sampler.start()
    wait_for(lambda: sampler.newest() is not None, timeout=120, interval=1, what="the first quiet row")
    floods: list[dict] = []

    def flood_phase(name: str, seconds: float) -> dict:
        print(f"{name} ...", flush=True)
        floods.append(flood(mesh, port, args, pools, seconds))
        return floods[-1]

    def flood_alone() -> dict:
        quiet.paused.set()
        return flood_phase("alone", args.flood_seconds)

    def resume_quiet() -> None:
        """Its newest row aged while paused: sample from its first new row on."""
        resumed = len(quiet.sent_at)
        quiet.paused.clear()
        wait_for(lambda: (sampler.newest() or -1) >= resumed, timeout=120, interval=0.5,
                 what="the quiet stream's first row after its pause")

    if args.warmup_seconds:
        flood_phase("warm-up", args.warmup_seconds)
    alone = [] if args.skip_alone else [flood_alone()]
    if alone:
        resume_quiet()
    print("before ...", flush=True)
    sampler.phase = "before"
    time.sleep(args.baseline_seconds)
    sampler.phase = "during"
    shared = flood_phase("during", args.flood_seconds)
    sampler.phase = ""
    if not args.skip_alone:
        alone.append(flood_alone())
    stop.set()
    quiet.join(180)
    if quiet.error:
        raise RuntimeError(f"quiet sender failed: {quiet.error!r}")
    sampled.set()
    sampler.join(30)
    deadline = time.monotonic() + 120
    while quiet_rows(mesh)[1] < quiet.accepted and time.monotonic() < deadline:
        time.sleep(1)
    loud = mesh.spark.sql(f"SELECT count(*), count(DISTINCT event_id) FROM logjam.messages "
                          f"WHERE app_env = '{LOUD}'").collect()[0]
    loud_acked = sum(run["acked"] for run in floods)
    return Result(lags, shared, alone, (quiet.accepted, *quiet_rows(mesh)), (loud_acked, int(loud[0]), int(loud[1])))


def report(r: Result, args: argparse.Namespace) -> None:
    print(f"fairness benchmark: 2 devices, 2 importers; {QUIET} at {args.quiet_rate:.0f} ev/s to device 0's "
          f"ROUTER; {LOUD} flooding over {args.connections} Lumberjack connections for {args.flood_seconds:.0f} s")
    for phase in ("before", "during"):
        p50, worst, n = r.lags.summary(phase)
        print(f"  quiet lag {phase:6} the flood: p50 {p50:5.2f} s, worst {worst:5.2f} s ({n} samples)"
              + (f"  (targets p50 <= {TARGETS['p50']:.0f} s: {TARGETS['p50'] / p50:.2f}x, worst <= "
                 f"{TARGETS['worst']:.0f} s: {TARGETS['worst'] / worst:.2f}x)" if phase == "during" else ""))
    def line(title: str, run: dict) -> None:
        print(f"  {title:28} {run['acked'] / run['elapsed']:9,.0f} ev/s acknowledged, "
              f"{run['landed'] / run['elapsed']:9,.0f} ev/s landed in the phase (drained {run['drain']:.1f} s "
              f"after the last ack)\n    {run['jobs']}\n    cores: {run['cores']}")

    for k, run in enumerate(r.alone):
        line(f"flood alone ({'AB'[k]}):", run)
    line("flood with the quiet stream:", r.shared)
    best = r.reference()
    if best is not None:
        share = (r.shared["landed"] / r.shared["elapsed"]) / max(best["landed"] / best["elapsed"], 1e-9)
        print(f"  flood with quiet / the better flood alone: {share:.2f} (target >= {TARGETS['share']:.2f}: "
              f"{share / TARGETS['share']:.2f}x)")
    for name, (acked, rows, distinct) in ((QUIET, r.quiet), (LOUD, r.loud)):
        print(f"  {name}: {acked} acknowledged, {rows} rows, lost {max(0, acked - distinct)}, "
              f"duplicated {rows - distinct}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood-seconds", type=float, default=90)
    ap.add_argument("--quiet-rate", type=float, default=50)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--baseline-seconds", type=float, default=20)
    ap.add_argument("--warmup-seconds", type=float, default=20, help="an unmeasured flood first (0: none)")
    ap.add_argument("--skip-alone", action="store_true", help="no flood-alone phases (no landed-rate comparison)")
    return ap
