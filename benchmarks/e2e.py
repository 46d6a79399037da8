"""End to end: from Lumberjack shippers to queryable rows, through the real mesh as `make up` runs it.

It starts supervisord with the repository's supervisord.conf and its defaults (embedded
Spark, 2 importers), only on spare ports, loopback and a temporary data dir, and waits
until the table answers. Then:
1. load: several Lumberjack connections send pre-encoded, compressed windows (2048 events
   of ~250 bytes, Filebeat numbering) as fast as the bridge acknowledges them, for
   --seconds. It reports acknowledged ev/s, landed ev/s (rows that became queryable in the
   same window), the time from the last ack until the last row is queryable, and lost and
   duplicated events (acknowledged against rows and distinct `event_id`s);
2. steady: one connection at --steady-rate ev/s for --steady-seconds; every event's time
   from being sent until it is queryable (its row counted in `logjam.messages` by the first
   poll that started after it was sent and saw it), p50/p99; beside it the same figures from
   the last poll that did not see it, which bound the truth from below (POLL_PAUSE_S).
Events carry the time they are sent, as shippers send them (an open day, compacted while it is
written); `--backdate DAYS` stamps them that many days ago instead (late data: a closed day
that keeps receiving rows). The CPU each program used during the load phase is printed too,
per landed event, next to its budget; the figure to optimise is where that time goes. Each
result is also given as a ratio of its target (targets and budgets: benchmarks/targets.toml).
CURVE is on, as `make up` runs it; `--no-curve` runs a copy of supervisord.conf whose device
takes --allow-plaintext and whose bridges and importers --plaintext, to measure its cost.

Scale-out (docs/scaling.md): `--devices D --importers N` runs D devices and N importers
(each importer owns whole devices; the bridge spreads its windows over the devices).
`--rate R` paces the load at R ev/s in total instead of as fast as acknowledged, which is
how importer CPU per landed event is compared across (D, N) at one rate. Each importer's
share of the rows is printed with its ratio to 1/N.
Usage: python benchmarks/e2e.py [--seconds 60] [--connections 4] [--steady-rate 5000]
       [--devices D --importers N] [--rate 20000] [--steady-seconds 0] [--no-curve] [--backdate DAYS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import Run  # noqa: E402
from harness import lumberjack_load, prometheus  # noqa: E402
from harness.lumberjack_load import WINDOW, Shipper, ship, windows  # noqa: E402
from harness.cpu import cpu  # noqa: E402
from harness.mesh import Mesh  # noqa: E402
from harness.processes import command  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402
from tools.mesh import DEFAULTS  # noqa: E402

# The kinds of process whose CPU per landed event has a budget (targets.toml: cpu_us_<kind>).
BUDGETED = ("logjam-spark", "logjam-importer", "logjam-device", "bridge-lumberjack")


def variant(args: argparse.Namespace) -> str | None:
    """The result's name beside the default run's: the mesh's shape and load when they are not the defaults."""
    parts = [f"d{args.devices}i{args.importers}"] if (args.devices, args.importers) != (
        int(DEFAULTS["LOGJAM_DEVICES"]), int(DEFAULTS["LOGJAM_IMPORTERS"])) else []
    parts += [f"rate{args.rate:g}"] if args.rate else []
    parts += ["plaintext"] if args.no_curve else []
    parts += [f"backdate{args.backdate:g}"] if args.backdate else []
    return "-".join(parts) or None


def load_phase(mesh: Mesh, port: int, args: argparse.Namespace) -> dict:
    pools = [windows(c, 16) for c in range(args.connections)]
    stop = threading.Event()
    pids = mesh.pids()
    cpu0, rows0, t0 = cpu(pids), mesh.rows(), time.perf_counter()
    # --rate: each connection sends a window every connections * WINDOW / rate seconds.
    pace = args.connections * WINDOW / args.rate if args.rate else 0.0
    shippers = [Shipper(port, pools[c], WINDOW, stop, pace=pace) for c in range(args.connections)]
    ship(shippers, args.seconds, stop)
    rows_at_end, t_end = mesh.rows(), time.perf_counter()
    cpu1 = cpu(pids)
    acked = sum(s.acked for s in shippers)
    last_ack = max(s.last_ack for s in shippers)
    deadline = time.monotonic() + 300
    rows = rows_at_end
    while rows < rows0 + acked and time.monotonic() < deadline:
        time.sleep(0.25)
        rows = mesh.rows()
    drain = time.perf_counter() - last_ack
    cpu_drained = cpu(pids)
    counts = mesh.spark.sql("SELECT count(*), count(DISTINCT event_id) FROM logjam.messages "
                            "WHERE app_env = 'lumberjack-default'").collect()[0]
    return {"acked": acked, "elapsed": t_end - t0, "landed_in_window": rows_at_end - rows0, "drain": drain,
            "rows": int(counts[0]) - rows0, "distinct": int(counts[1]) - rows0,
            "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1},
            "cpu_drained": {k: cpu_drained[k] - cpu0.get(k, 0.0) for k in cpu_drained}, "shares": mesh.shares()}


def bytes_per_row(mesh: Mesh) -> tuple[float, float]:
    """(bytes/row of the stream's live files now, and after a compaction pass that merges everything)."""
    def measure() -> tuple[float, int]:
        row = mesh.spark.sql("SELECT sum(size), sum(rows), count(*) FROM (SELECT _metadata.file_path, "
                             "first(_metadata.file_size) AS size, count(*) AS rows FROM logjam.messages "
                             "WHERE app_env = 'lumberjack-default' GROUP BY 1)").collect()[0]
        return int(row[0]) / max(int(row[1]), 1), int(row[2])

    before, files = measure()
    # A pass may lose to logjam-spark's own pass: try again until the partition is one file, or
    # until passes stop compacting.
    deadline, idle = time.monotonic() + 600, 0
    while files > 1 and idle < 3 and time.monotonic() < deadline:
        subprocess.run([command("logjam-sql"), "--warehouse", f"{mesh.env['LOGJAM_DATA_DIR']}/warehouse", "--compact",
                        "--older-than", "0"], env=mesh.env, capture_output=True, timeout=600, check=True)
        files, was = measure()[1], files
        idle = idle + 1 if files >= was else 0
    return before, measure()[0]


# The importers' histograms that split a row's freshness: its batch's wait and write (commit_delay:
# from the batch's first row until committed) and, within it, the write.
COMMIT_HISTOGRAMS = ("logjam_importer_commit_delay_seconds", "logjam_importer_write_seconds")


def commit_histograms(mesh: Mesh) -> dict[str, prometheus.Buckets]:
    """COMMIT_HISTOGRAMS, each summed over the importers."""
    base = int(mesh.env["LOGJAM_IMPORTER_METRICS_PORT"])
    out: dict[str, prometheus.Buckets] = {}
    for name in COMMIT_HISTOGRAMS:
        out[name] = {}
        for i in range(int(mesh.env["LOGJAM_IMPORTERS"])):
            for le, n in prometheus.buckets(base + i, name).items():
                out[name][le] = out[name].get(le, 0.0) + n
    return out


def describe_commits(h: dict[str, prometheus.Buckets]) -> str:
    """One line: the steady phase's commits and where a batch's time went, read off the histograms' buckets."""
    q = {name: (prometheus.quantile(b, 0.5), prometheus.quantile(b, 0.99)) for name, b in h.items()}
    delay, write = (q[name] for name in COMMIT_HISTOGRAMS)
    return (f"of which the importers' {prometheus.total(h[COMMIT_HISTOGRAMS[0]]):.0f} commits: a batch's first row "
            f"-> committed p50 {delay[0]:.2f} s, p99 {delay[1]:.2f} s; its write p50 {write[0] * 1e3:.0f} ms, "
            f"p99 {write[1] * 1e3:.0f} ms")


# The steady phase's pause between two polls. A poll is one count query (0.2-0.4 s on the quiet
# machine), and a row's latency is read off the first poll that sees it, so the latency carries
# up to one poll interval of rounding; the pause is kept short so that the interval is mostly the
# query itself. The lower bound printed beside each figure is the last poll that did not see it.
POLL_PAUSE_S = 0.05


def steady_phase(mesh: Mesh, port: int, args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    """(each event's sent -> first poll that saw it, sent -> last poll that did not, the mean poll interval)."""
    size = 250
    pace = size / args.steady_rate
    pool = windows(99, 64, size)
    base = mesh.rows()
    stop = threading.Event()
    shipper = Shipper(port, pool, size, stop, pace=pace)
    shipper.start()
    visible_at: list[tuple[float, int]] = []
    t_end = time.perf_counter() + args.steady_seconds
    while time.perf_counter() < t_end:
        visible_at.append((time.perf_counter(), mesh.rows() - base))
        time.sleep(POLL_PAUSE_S)
    stop.set()
    shipper.join(30)
    total = shipper.acked
    while not visible_at or visible_at[-1][1] < total:
        visible_at.append((time.perf_counter(), mesh.rows() - base))
        if time.perf_counter() - t_end > 120:
            raise SystemExit(f"steady phase: only {visible_at[-1][1]} of {total} rows landed")
        time.sleep(POLL_PAUSE_S)
    latencies, lower, j = [], [], 0
    for w, sent in enumerate(shipper.sent_at[: total // size]):
        needed = (w + 1) * size  # one stream, one importer, commits in order: a prefix is visible
        while visible_at[j][1] < needed:
            j += 1
        latencies += [visible_at[j][0] - sent] * size
        lower += [max(visible_at[j - 1][0] - sent, 0.0) if j else 0.0] * size
    interval = (visible_at[-1][0] - visible_at[0][0]) / max(len(visible_at) - 1, 1)
    return latencies, lower, interval


def per_event_us(cpu_seconds: dict[str, float], kind: str, rows: int) -> float:
    """CPU of every process of one kind (`logjam-importer` matches each importer; `logjam-device` each device), per row."""
    total = sum(v for k, v in cpu_seconds.items() if k.split(":")[0].startswith(kind))
    return total / max(rows, 1) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--steady-rate", type=float, default=5000)
    ap.add_argument("--steady-seconds", type=float, default=30, help="0 skips the steady phase")
    ap.add_argument("--no-curve", action="store_true", help="every ZeroMQ socket in plaintext (default: CURVE, as make up)")
    ap.add_argument("--devices", type=int, default=int(DEFAULTS["LOGJAM_DEVICES"]))
    ap.add_argument("--importers", type=int, default=int(DEFAULTS["LOGJAM_IMPORTERS"]))
    ap.add_argument("--rate", type=float, default=0.0, help="pace the load phase at this many ev/s in total (default: "
                    "as fast as acknowledged)")
    ap.add_argument("--backdate", type=float, default=0.0, metavar="DAYS",
                    help="stamp events this many days ago (late data into a closed day; default: the time they are sent)")
    args = ap.parse_args()
    run = Run("e2e", variant=variant(args))
    targets = {name: run.target(name) for name in ("landed", "drain", "p50", "p99")}
    budgets_us = {kind: run.target(f"cpu_us_{kind.replace('-', '_')}") for kind in BUDGETED}
    stamped = time.time() - args.backdate * 86400
    lumberjack_load.STAMP = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(stamped))
    if args.importers > args.devices:
        ap.error("--importers must not exceed --devices (each importer owns whole devices)")
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-e2e-"))
    started = time.monotonic()
    mesh = Mesh(base / "data", args.devices, args.importers, curve=not args.no_curve)
    print(f"CURVE {'off' if args.no_curve else 'on'} (every ZeroMQ TCP port; the mesh's own hops use the devices' ipc endpoints)", flush=True)
    try:
        port = int(mesh.env["LOGJAM_LUMBERJACK_PORT"])
        print(f"mesh up in {time.monotonic() - started:.0f} s", flush=True)
        r = load_phase(mesh, port, args)
        commits_before = commit_histograms(mesh)
        lat, low, poll = steady_phase(mesh, port, args) if args.steady_seconds > 0 else ([], [], 0.0)
        commits = {name: prometheus.between(commits_before[name], after)
                   for name, after in commit_histograms(mesh).items()}
        lat, low = sorted(lat), sorted(low)
        disk = bytes_per_row(mesh)
        acked_rate, landed_rate = r["acked"] / r["elapsed"], r["landed_in_window"] / r["elapsed"]
        lost, dup = max(0, r["acked"] - r["distinct"]), r["rows"] - r["distinct"]
        print(f"e2e benchmark: {args.devices} devices, {args.importers} importers, {args.connections} Lumberjack "
              f"connections, {WINDOW}-event windows, {r['elapsed']:.0f} s, events stamped {lumberjack_load.STAMP}"
              + (f", paced at {args.rate:,.0f} ev/s" if args.rate else ", as fast as acknowledged"))
        print(f"  acknowledged:        {acked_rate:9,.0f} ev/s ({r['acked']} events)")
        print(f"  landed (queryable):  {landed_rate:9,.0f} ev/s in the same window "
              f"({landed_rate / targets['landed']:.2f}x of the {targets['landed']:,.0f} target; "
              f"{landed_rate / max(acked_rate, 1e-9):.2f}x of what the bridge acknowledged in the same run)")
        print(f"  last ack -> last row queryable: {r['drain']:.1f} s ({targets['drain'] / max(r['drain'], 1e-9):.2f}x "
              f"of the {targets['drain']:.0f} s target)")
        if lat:
            p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
            lo50, lo99 = low[len(low) // 2], low[int(len(low) * 0.99)]
            met = p50 <= targets["p50"] and p99 <= targets["p99"]
            print(f"  steady {args.steady_rate:,.0f} ev/s, sent -> queryable: p50 {p50:.2f} s, p99 {p99:.2f} s "
                  f"(targets p50 <= {targets['p50']} s, p99 <= {targets['p99']} s: {'met' if met else 'MISSED'}; "
                  f"a poll every {poll:.2f} s, the last poll that did not see them: p50 {lo50:.2f} s, p99 {lo99:.2f} s)")
            print("  " + describe_commits(commits))
        print(f"  lost {lost}, duplicated {dup} (rows {r['rows']}, distinct event ids {r['distinct']})")
        print(f"  bytes on disk per row: {disk[0]:.1f} as landed (compaction passes ran meanwhile), "
              f"{disk[1]:.1f} after a full compaction")
        busy = sum(r["cpu"].values())
        print(f"  CPU during the load phase ({busy / r['elapsed']:.2f} of {os.cpu_count()} cores busy): " + ", ".join(
            f"{k} {v / r['elapsed']:.2f}" for k, v in sorted(r["cpu"].items(), key=lambda kv: -kv[1]) if v > 0.05))
        print("  CPU per landed event, load start until drained (budget): " + ", ".join(
            f"{kind} {us:.1f} us ({budget / max(us, 1e-9):.2f}x of {budget:.1f})"
            for kind, budget in budgets_us.items() for us in [per_event_us(r["cpu_drained"], kind, r["rows"])]))
        importer_cpu = sum(v for k, v in r["cpu_drained"].items() if k.startswith("logjam-importer"))
        print(f"  importer CPU per landed event (load start until drained): {importer_cpu / max(r['rows'], 1) * 1e6:.2f} us "
              f"({importer_cpu:.1f} s for {r['rows']} rows)")
        total = max(sum(r["shares"].values()), 1)
        print("  importer shares of the rows: " + ", ".join(
            f"importer {i} {n / total:.3f} ({n / total * args.importers:.2f}x of 1/{args.importers})"
            for i, n in sorted(r["shares"].items())))
        print(f"  total run time {time.monotonic() - started:.0f} s")
        run.figure("acknowledged", acked_rate, "ev/s")
        run.check("landed", landed_rate)
        run.check("drain", r["drain"])
        if lat:
            run.check("p50", p50)
            run.check("p99", p99)
        for kind in BUDGETED:
            run.check(f"cpu_us_{kind.replace('-', '_')}", per_event_us(r["cpu_drained"], kind, r["rows"]))
        run.check("lost", lost)
        run.check("duplicated", dup)
        run.figure("bytes on disk per row, as landed", disk[0], "bytes")
        run.figure("bytes on disk per row, after a full compaction", disk[1], "bytes")
        run.figure("cores busy during the load phase", busy / r["elapsed"], "cores")
        run.save()
        return 0 if lost == 0 and dup == 0 else 1
    finally:
        mesh.shutdown()
        shutil.rmtree(base, ignore_errors=True)  # the plaintext supervisord.conf too (Mesh writes it there)


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
