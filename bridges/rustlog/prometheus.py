"""RustLog's metrics as Prometheus text (the binary MetricsFetch answer), through prometheus_client.

The bridge describes its metrics once, as `Metric` and `Summary` values; `metric_values`
gives the JSON dialect's answer and `render_prometheus` the binary one, rendered by
prometheus_client's exposition code. `parse_prometheus` is the client side: the samples of
a received text, read with prometheus_client's parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric as MetricFamily
from prometheus_client.metrics_core import SummaryMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from logjam.errors import LocalProtocolError

from bridges.rustlog.messages import MalformedResponse

# prometheus_client writes every value as a Go float ("3.0"); this bridge has always sent
# integral values as integers ("3"), and tests/test_rustlog_engine.py pins that text.
_INTEGRAL_SAMPLE = re.compile(r"^([^#\n][^\n]* -?[0-9]+)\.0$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Metric:
    """One counter or gauge; a counter's name ends in `_total`, as prometheus_client writes it."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    value: float


@dataclass(frozen=True, slots=True)
class Summary:
    """A count and a sum (a latency): the samples `<name>_count` and `<name>_sum`."""

    name: str
    help: str
    count: int
    sum: float


def metric_values(metrics: Iterable[Metric | Summary]) -> dict[str, float]:
    """Every sample by its name without the prefix: the JSON dialect's MetricsFetch answer."""
    out: dict[str, float] = {}
    for m in metrics:
        if isinstance(m, Summary):
            out[m.name + "_count"] = m.count
            out[m.name + "_sum"] = m.sum
        else:
            out[m.name] = m.value
    return out


class _Snapshot:
    """A prometheus_client collector over values taken once (nothing is registered globally)."""

    def __init__(self, metrics: Iterable[Metric | Summary], prefix: str) -> None:
        self._metrics = list(metrics)
        self._prefix = prefix

    def collect(self) -> Iterator[MetricFamily]:
        for m in self._metrics:
            name = self._prefix + m.name
            if isinstance(m, Summary):
                yield SummaryMetricFamily(name, m.help, count_value=m.count, sum_value=m.sum)
            elif m.kind == "counter":
                yield CounterMetricFamily(name, m.help, value=m.value)
            elif m.kind == "gauge":
                yield GaugeMetricFamily(name, m.help, value=m.value)
            else:
                raise LocalProtocolError(f"metric {m.name!r} has kind {m.kind!r}, not counter or gauge")


def render_prometheus(metrics: Iterable[Metric | Summary], prefix: str = "rustlog_") -> str:
    """The Prometheus text exposition of `metrics`, each name with `prefix`."""
    text = generate_latest(_Snapshot(metrics, prefix)).decode("utf-8")
    return _INTEGRAL_SAMPLE.sub(r"\1", text)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name (with its labels, if any) -> value; text that does not parse is a `MalformedResponse`."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    except (ValueError, IndexError) as e:
        raise MalformedResponse(f"metrics text does not parse: {e}") from None
    return out
