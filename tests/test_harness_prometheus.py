"""harness/prometheus.py reads an importer's real /metrics: what benchmarks/e2e.py prints of the
importers' commits comes from it."""

from __future__ import annotations

import math

import pytest

from harness import prometheus
from harness.processes import free_port
from importer.metrics import ImporterMetrics

pytestmark = pytest.mark.timeout(30)


def test_quantiles_of_an_importer_s_commit_delays_over_a_phase():
    metrics = ImporterMetrics(0)
    server = metrics.serve(0, "127.0.0.1")
    try:
        for _ in range(10):  # before the phase
            metrics.commit_delay.observe(5.0)
        before = prometheus.buckets(server.port, "logjam_importer_commit_delay_seconds")
        for i in range(100):  # the phase: 98 batches at 0.5-0.55 s, two late ones
            metrics.commit_delay.observe(0.5 + 0.05 * (i + 1) / 100 if i < 98 else 2.5)
        phase = prometheus.between(before, prometheus.buckets(server.port, "logjam_importer_commit_delay_seconds"))
    finally:
        server.close()
    assert prometheus.total(before) == 10 and prometheus.total(phase) == 100
    assert 0.5 < prometheus.quantile(phase, 0.5) <= 0.55
    assert 2.0 < prometheus.quantile(phase, 0.99) <= 3.0  # the 99th observation is a late one
    assert prometheus.quantile(phase, 0.98) <= 0.55


def test_nothing_observed_or_nothing_answering():
    assert math.isnan(prometheus.quantile({}, 0.5))
    assert prometheus.quantile({1.0: 0.0, math.inf: 4.0}, 0.5) == 1.0  # past the last bound: that bound
    assert prometheus.buckets(free_port(), "logjam_importer_commit_delay_seconds") == {}
