"""A process's Prometheus histograms, read from its /metrics around a phase of a benchmark.

`buckets(port, name)` sums a histogram's cumulative bucket counts over its label sets;
`between(before, after)` is what was observed in between; `quantile` reads a quantile off
such buckets, as Prometheus's `histogram_quantile` does: linearly inside the bucket it falls
in, so it is as exact as the buckets are fine.
"""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Buckets = dict[float, float]  # upper bound (le) -> observations at or below it, cumulative


def buckets(port: int, name: str) -> Buckets:
    """The histogram `name` (without `_bucket`) of the process serving /metrics on `port`; {} when it does not answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                out[le] = out.get(le, 0.0) + sample.value
    return out


def between(before: Buckets, after: Buckets) -> Buckets:
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def total(b: Buckets) -> float:
    return b.get(math.inf, 0.0)


def quantile(b: Buckets, q: float) -> float:
    """The q-quantile (0 < q <= 1) of the observations counted in `b`; NaN when there are none.
    One that falls in the last, unbounded bucket is reported as the highest finite bound."""
    n = total(b)
    if n <= 0:
        return math.nan
    rank, lower, below = q * n, 0.0, 0.0
    for le in sorted(b):
        if b[le] >= rank:
            if math.isinf(le):
                return lower
            width = b[le] - below
            return lower + (le - lower) * ((rank - below) / width if width else 1.0)
        lower, below = le, b[le]
    return lower
