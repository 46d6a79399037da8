"""One loud stream does not take a quiet one's freshness (issue 35), through the mesh `make up` runs.

The scenario of benchmarks/fairness.py with smaller numbers: `quiet-prod` at 20 ev/s to device
0's ROUTER while two Lumberjack connections flood both devices (through the bridge) for 40 s,
long enough for the importers to fall behind by more than the device's fair threshold (5 s)
so that it parks the flood. The quiet stream's newest queryable event must stay within 8 s at
p50 (the issue's 5 s p50 and 10 s worst are the benchmark's targets, not met yet), and
nothing acknowledged is lost or doubled in either stream.
(Before devices/fair.py the same run measured ~10 s at p50: the quiet events waited behind
the flood.) The flood's landed rate against the flood alone is the benchmark's to measure.
"""

from __future__ import annotations

import pytest

from benchmarks.e2e import Mesh
from benchmarks.fairness import TARGETS, measure, parser, report

# Half-way between the p50 before fair admission (10-12 s) and the target (5 s).
PARKED_P50 = 8.0

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]


def test_a_quiet_stream_stays_fresh_while_another_floods_the_mesh(tmp_path) -> None:
    args = parser().parse_args(["--flood-seconds", "40", "--quiet-rate", "20", "--connections", "2",
                                "--baseline-seconds", "5", "--skip-alone"])
    mesh = Mesh(tmp_path / "data", 2, 2)
    try:
        result = measure(mesh, args)
        report(result, args)
    finally:
        mesh.shutdown()
    p50, worst, samples = result.lags.summary("during")
    assert samples >= 10, f"only {samples} lag samples during the flood"
    assert result.shared["acked"] > 0 and result.quiet[0] > 0
    assert result.lost_or_doubled() == 0, (result.quiet, result.loud)
    # The targets (TARGETS: 5 s p50, 10 s worst) are benchmarks/fairness.py's to report;
    # on the 2-core machine they are not met yet (quiet, 06:55 on 2026-11-27: p50 5.5 s, worst
    # 11.7 s; issue 35 stays open). What this test holds is the mechanism's gain: before
    # devices/fair.py the quiet stream's p50 was 10-12 s during such a flood.
    assert p50 <= PARKED_P50, f"quiet lag during the flood: p50 {p50:.1f} s, worst {worst:.1f} s (targets {TARGETS})"
