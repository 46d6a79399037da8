"""Prometheus metrics of one importer worker, served with /healthz on `--metrics-port`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from runtime.health import HealthCheck, MetricsServer
from runtime.health import serve as serve_http


class ImporterMetrics:
    def __init__(self, worker: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"worker": str(worker)}
        r = self.registry
        self.received = Counter("logjam_importer_messages_received", "Messages received from devices, heartbeats included",
                                ["worker"], registry=r).labels(**labels)
        self.skipped = Counter("logjam_importer_messages_skipped", "Messages owned by another worker or outside --app-env",
                               ["worker"], registry=r).labels(**labels)
        self.rows = Counter("logjam_importer_rows", "Rows accepted into batches, per stream", ["worker", "app_env"], registry=r)
        self.parse_errors = Counter("logjam_importer_parse_errors", "Rows whose body could not be decompressed or parsed",
                                    ["worker", "app_env"], registry=r)
        self.written = Counter("logjam_importer_rows_written", "Rows committed to the table", ["worker"], registry=r).labels(**labels)
        self.batches = Counter("logjam_importer_batches_written", "Batches committed to the table", ["worker"], registry=r).labels(**labels)
        self.write_failures = Counter("logjam_importer_write_failures", "Failed batch write attempts (retried)",
                                      ["worker"], registry=r).labels(**labels)
        self.lost_rows = Counter("logjam_importer_rows_lost", "Rows given up on at shutdown after failed writes",
                                 ["worker"], registry=r).labels(**labels)
        self.write_seconds = Histogram("logjam_importer_write_seconds", "Seconds per batch write", ["worker"],
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
                                       registry=r).labels(**labels)
        self.batch_rows = Histogram("logjam_importer_batch_rows", "Rows per batch write (group commit follows the load)",
                                    ["worker"], buckets=(100, 1000, 10_000, 50_000, 100_000, 200_000, 500_000),
                                    registry=r).labels(**labels)
        self.batch_bytes = Histogram("logjam_importer_batch_bytes", "Bytes per batch write (bounded by --batch-bytes)",
                                     ["worker"], buckets=(2**16, 2**20, 2**23, 2**24, 2**25, 2**26, 2**27, 2**28),
                                     registry=r).labels(**labels)
        self.commit_delay = Histogram("logjam_importer_commit_delay_seconds",
                                      "Seconds from a batch's first row to its commit", ["worker"],
                                      # Fine around --flush-interval's default (0.5 s), where a second's freshness is won or lost.
                                      buckets=(0.1, 0.25, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1, 1.5, 2, 3, 5, 8, 13, 21,
                                               34, 60), registry=r).labels(**labels)
        self.last_write = Gauge("logjam_importer_last_write_timestamp_seconds", "Unix time of the last committed batch",
                                ["worker"], registry=r).labels(**labels)
        self.quarantined_rows = Counter("logjam_importer_rows_quarantined",
                                        "Rows written to the quarantine partition because their writes kept failing",
                                        ["worker"], registry=r).labels(**labels)
        self.overflowed_app_envs = Counter("logjam_importer_app_envs_overflowed",
                                           "New streams sent to a day's overflow partition (--max-new-app-envs)",
                                           ["worker"], registry=r).labels(**labels)
        self.out_of_window = Counter("logjam_importer_rows_out_of_window",
                                     "Rows whose created_at lay outside the window around their arrival (more than "
                                     "--retention-days before it or a day after it): filed under the day they arrived",
                                     ["worker", "app_env"], registry=r)
        self.write_stalls = Counter("logjam_importer_write_stalls", "Commits under way longer than --write-timeout",
                                    ["worker"], registry=r).labels(**labels)
        self.write_stalled = Gauge("logjam_importer_write_stalled", "1 while a commit has been under way too long",
                                   ["worker"], registry=r).labels(**labels)
        self.journal_changes = Counter("logjam_importer_journal_changes",
                                       "Times a device started serving a new journal (wiped or replaced): read from its first seq",
                                       ["worker", "device"], registry=r)
        self.duplicate_device_ids = Counter("logjam_importer_duplicate_device_ids",
                                            "Journal ids flipping back and forth: two live devices share one id",
                                            ["worker", "device"], registry=r)
        self.gap_messages = Counter("logjam_importer_gap_messages", "Messages missing from a device's sequence (gaps; with replay: only those replay could not fetch)",
                                    ["worker", "device"], registry=r)
        self.device_restarts = Counter("logjam_importer_device_restarts", "Times a device's sequence went backwards",
                                       ["worker", "device"], registry=r)
        self.replayed = Counter("logjam_importer_replayed_messages", "Messages fetched from a device's replay endpoint",
                                ["worker", "device"], registry=r)
        self.recovered_gaps = Counter("logjam_importer_recovered_gaps",
                                      "Holes in a device's sequence filled completely through replay (start-up catch-up included)",
                                      ["worker", "device"], registry=r)
        self.lost_messages = Counter("logjam_importer_lost_messages",
                                     "Messages the device's journal no longer had (retention): real, counted losses",
                                     ["worker", "device"], registry=r)
        self.duplicates = Counter("logjam_importer_duplicates_dropped", "Messages dropped because their seq was already covered",
                                  ["worker", "device"], registry=r)
        self.duplicate_events = Counter("logjam_importer_duplicate_events",
                                        "Messages not written because their @metadata._id was already written in the stream",
                                        ["worker", "app_env"], registry=r)
        self.checkpoint_seq = Gauge("logjam_importer_checkpoint_seq",
                                    "Highest seq of the device this worker's commits have landed (or filtered out), its app transaction's version",
                                    ["worker", "device"], registry=r)
        self.pending_batches = Gauge("logjam_importer_pending_batches", "Batches queued for or being committed to the table",
                                     ["worker"], registry=r).labels(**labels)
        self.reconnects = Gauge("logjam_importer_subscriber_reconnects", "SUB reconnects after missed heartbeats",
                                ["worker"], registry=r).labels(**labels)
        self.worker = str(worker)

    def serve(self, port: int, addr: str = "0.0.0.0", health: HealthCheck | None = None) -> MetricsServer:
        """/metrics and /healthz (runtime.health)."""
        return serve_http(self.registry, port, addr, health=health)
