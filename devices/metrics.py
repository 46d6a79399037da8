"""Prometheus exposition and /healthz for --metrics-port, built on prometheus_client and runtime.health.

The hot loop keeps plain integer counters; a custom collector turns a snapshot of
them into metric families at scrape time, so counting costs the loop nothing.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from devices.device import Device
from devices.stamp import REASONS
from runtime.health import Check, MetricsServer
from runtime.health import serve as serve_http


class DeviceCollector(Collector):
    def __init__(self, device: Device) -> None:
        self.device = device

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        snap = self.device.snapshot()
        received = CounterMetricFamily(
            "logjam_device_received", "Messages taken from an input socket (pings excluded)", labels=["socket"]
        )
        for sock, n in sorted(snap["received"].items()):
            received.add_metric([sock], n)
        yield received
        yield CounterMetricFamily("logjam_device_published", "Messages published on PUB, heartbeats included", value=snap["published"])
        yield CounterMetricFamily("logjam_device_heartbeats", "Heartbeats published", value=snap["heartbeats"])
        yield CounterMetricFamily("logjam_device_pings", "Pings answered", value=snap["pings"])
        dropped = CounterMetricFamily(
            "logjam_device_dropped", "Messages dropped, by reason and stream", labels=["reason", "app_env"]
        )
        by_reason = dict.fromkeys(REASONS, 0)
        for (reason, app_env), n in sorted(snap["dropped"].items()):
            dropped.add_metric([reason, app_env], n)
            by_reason[reason] = by_reason.get(reason, 0) + n
        yield dropped
        totals = CounterMetricFamily(
            "logjam_device_dropped_by_reason", "Messages dropped, by reason", labels=["reason"]
        )
        for reason, n in by_reason.items():
            totals.add_metric([reason], n)
        yield totals
        per_app = CounterMetricFamily(
            "logjam_device_app_env_messages", "Messages accepted and published, by stream", labels=["app_env"]
        )
        for app_env, n in sorted(snap["per_app_env"].items()):
            per_app.add_metric([app_env], n)
        yield per_app
        yield GaugeMetricFamily("logjam_device_sequence", "The last sequence number the device used", value=snap["seq"])
        ident = GaugeMetricFamily("logjam_device_journal_id", "The journal the sequence numbers belong to (always 1)",
                                  labels=["journal"])
        ident.add_metric([snap["journal_id"]], 1)
        yield ident
        importers = snap["importers"]
        lag = GaugeMetricFamily("logjam_device_importer_lag_seconds",
                                "How long the oldest message an importer has not committed was published ago",
                                labels=["importer"])
        for name, seconds in importers["lag"].items():
            lag.add_metric([name], seconds)
        yield lag
        yield GaugeMetricFamily("logjam_device_input_held", "1 while importers are too far behind and input waits",
                                value=int(importers["holding"]))
        yield CounterMetricFamily("logjam_device_input_held_seconds",
                                  "Seconds input waited for importers (--max-importer-lag)", value=importers["held_seconds"])
        fair = snap["fair"]
        yield GaugeMetricFamily("logjam_device_fair_parked", "Messages of loud streams parked while importers are behind "
                                "(neither published nor acknowledged yet; devices/fair.py)", value=fair["parked"])
        yield CounterMetricFamily("logjam_device_fair_parked_messages", "Messages parked since start", value=fair["parked_total"])
        yield CounterMetricFamily("logjam_device_fair_parked_seconds", "Seconds the device parked loud streams",
                                  value=fair["parked_seconds"])
        yield GaugeMetricFamily("logjam_device_fair_longest_park_seconds",
                                "The longest a parked message (and its acknowledgement) waited", value=fair["longest"])
        yield from self._curve()
        journal = snap["journal"]
        if journal is not None:
            yield GaugeMetricFamily("logjam_device_journal_writable",
                                    "1 while journal writes succeed; 0 while the device holds a batch it cannot write",
                                    value=int(journal["journal_writable"]))
            yield CounterMetricFamily("logjam_device_journal_write_failures", "Journal writes (and fsyncs) that failed",
                                      value=journal["journal_write_failures"])
            yield GaugeMetricFamily("logjam_device_journal_held_messages",
                                    "Messages waiting for the journal (neither published nor acknowledged)",
                                    value=journal["held_messages"])
            yield GaugeMetricFamily("logjam_device_journal_bytes", "Bytes in the journal's segment files", value=journal["bytes"])
            yield GaugeMetricFamily("logjam_device_journal_segments", "Segment files in the journal", value=journal["segments"])
            yield GaugeMetricFamily("logjam_device_journal_first_seq", "The oldest sequence number retention kept", value=journal["first_seq"])
            yield GaugeMetricFamily("logjam_device_journal_last_seq", "The newest journaled sequence number", value=journal["last_seq"])
            yield CounterMetricFamily("logjam_device_journal_fsyncs", "fsync calls on the journal", value=journal["fsyncs"])
            yield CounterMetricFamily("logjam_device_journal_written_bytes", "Bytes appended to the journal", value=journal["bytes_written"])
            yield CounterMetricFamily("logjam_device_journal_segments_deleted", "Segments deleted by retention", value=journal["segments_deleted"])
            yield CounterMetricFamily("logjam_device_replay_requests", "Replay requests received", value=journal["replay_requests"])
            yield CounterMetricFamily("logjam_device_replay_messages", "Messages served by replay", value=journal["replay_messages"])
            yield CounterMetricFamily("logjam_device_replay_bad_requests", "Malformed replay requests ignored", value=journal["replay_bad_requests"])

    def _curve(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        gate = self.device.gate
        if gate is None:
            return
        refused = CounterMetricFamily("logjam_device_curve_refused",
                                      "Connections refused by CURVE, by socket and reason (no_curve, bad_handshake, "
                                      "not_allowed, mechanism, protocol_error)", labels=["socket", "reason"])
        for (sock, reason), n in sorted(gate.refused.items()):
            refused.add_metric([sock, reason], n)
        yield refused
        yield CounterMetricFamily("logjam_device_curve_admitted", "CURVE handshakes admitted by the allowlist",
                                  value=gate.admitted)
        yield GaugeMetricFamily("logjam_device_curve_allowed_keys", "Public keys in the CURVE allowlist",
                                value=len(gate.allowed))
        reloads = CounterMetricFamily("logjam_device_curve_reloads", "SIGHUP reloads of the allowlist", labels=["result"])
        reloads.add_metric(["ok"], gate.reloads)
        reloads.add_metric(["failed"], gate.reload_failures)
        yield reloads


def health(device: Device) -> list[Check]:
    """/healthz: the loop publishes (a heartbeat at least every --heartbeat-interval), the journal writes."""
    snap = device.snapshot()
    interval = device.config.heartbeat_interval
    # A heartbeat is due every interval; allow for a slow batch before calling the loop stuck.
    limit = max(3 * interval, interval + 5.0)
    age = snap["heartbeat_age"]
    checks = [Check("publishing", age <= limit,
                    f"last heartbeat {age:.1f}s ago (limit {limit:.0f}s), seq {snap['seq']}")]
    journal = snap["journal"]
    if journal is not None:
        ok = bool(journal["journal_writable"])
        checks.append(Check("journal", ok, "writable" if ok else
                            f"not writable: holding {journal['held_messages']} messages, accepting nothing"))
    curve = device.config.curve
    # An open socket is a choice (--allow-plaintext), not a fault: said, not failed.
    checks.append(Check("curve", True, curve.describe() if curve is not None else "CURVE off: every socket OPEN"))
    holding = snap["importers"]["holding"]
    # Held input is flow control doing its job, not a fault of the device: reported, not failed.
    checks.append(Check("input", True, "held: an importer is too far behind" if holding else "accepting"))
    return checks


def serve(device: Device, port: int, address: str = "0.0.0.0") -> MetricsServer:
    """Serve /metrics and /healthz from a daemon thread (runtime.health)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceCollector(device))
    return serve_http(registry, port, address, health=lambda: health(device))
