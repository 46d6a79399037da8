"""Fairness: one loud stream must not take a quiet stream's freshness.

It starts the mesh as `make up` runs it (supervisord.conf, 2 devices, 2 importers, CURVE on;
`harness/mesh.py`'s `Mesh`) on spare ports and a temporary data dir, then:
0. warm-up: the loud stream floods for --warmup-seconds while `quiet-prod` sends, unmeasured,
   so that no phase pays the JVM's first compilations or the first files of a day;
1. the flood alone (A): --connections Lumberjack connections (app-env `lumberjack-default`,
   the loud stream) send as fast as the bridge acknowledges them, over both devices, for
   --flood-seconds, while `quiet-prod` is paused;
2. quiet alone: `quiet-prod` sends --quiet-rate ev/s as a Logjam agent (DEALER to device 0's
   ROUTER) for --baseline-seconds; its lag is sampled;
3. flood + quiet: the flood again while `quiet-prod` goes on; its lag is sampled;
4. the flood alone (B), `quiet-prod` paused again.
The flood-alone phases stand on both sides of the shared one, so that neither a warmer JVM
nor a smaller table favours one side; the reference is the better of the two. The lag query
runs through every phase (its samples unfiled outside 2 and 3), so that all flood phases
carry the same measuring load. Every phase starts after the one before it drained.

The quiet stream's lag is the age of its newest queryable event: about once a second the
largest event number of `quiet-prod` in `logjam.messages` is read, and lag = the time the
query started minus the time that event was sent. It prints p50 and worst, before and during
the flood, and the flood's landed rate (rows queryable within the phase, per second) with
and without the quiet stream, against the targets (benchmarks/targets.toml): the quiet stream's
p50 and worst lag during the flood, and the share of what the flood lands alone that it still
lands beside it. Lost and duplicated events are checked for both streams (acknowledged against
rows and distinct ids).
Usage: python benchmarks/fairness.py [--flood-seconds 90] [--quiet-rate 50] [--connections 4]
       [--baseline-seconds 20] [--warmup-seconds 20] [--skip-alone]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import Run  # noqa: E402
from harness.fairness import measure, parser, report  # noqa: E402
from harness.mesh import Mesh  # noqa: E402
from runtime.lifecycle import exit_with  # noqa: E402


def main() -> int:
    args = parser().parse_args()
    run = Run("fairness")
    base = Path(tempfile.mkdtemp(prefix="logjam-bench-fair-"))
    started = time.monotonic()
    mesh = Mesh(base / "data", 2, 2)
    try:
        print(f"mesh up in {time.monotonic() - started:.0f} s", flush=True)
        result = measure(mesh, args)
        report(result, args)
        print(f"  total run time {time.monotonic() - started:.0f} s")
        record(run, result)
        return 0 if result.lost_or_doubled() == 0 else 1
    finally:
        mesh.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def record(run: Run, result) -> None:  # type: ignore[no-untyped-def]
    """The figures `report` printed, held against the targets, into the benchmark's result file."""
    p50, worst, _ = result.lags.summary("during")
    run.check("quiet_p50", p50)
    run.check("quiet_worst", worst)
    best = result.reference()
    if best is not None:
        run.check("flood_share", (result.shared["landed"] / result.shared["elapsed"])
                  / max(best["landed"] / best["elapsed"], 1e-9))
    run.figure("flood with the quiet stream, landed", result.shared["landed"] / result.shared["elapsed"], "ev/s")
    run.check("lost", sum(max(0, acked - distinct) for acked, _, distinct in (result.quiet, result.loud)))
    run.check("duplicated", sum(rows - distinct for _, rows, distinct in (result.quiet, result.loud)))
    run.save()


if __name__ == "__main__":
    # Spark Connect's atexit hook would call the server stopped above and retry for minutes.
    exit_with(main)
