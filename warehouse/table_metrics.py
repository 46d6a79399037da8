"""logjam-spark's Prometheus metrics of the `messages` table and of the maintenance that keeps it.

A census (`census`) sets the table's gauges and per-partition histograms from the add actions
of one snapshot and from its `_delta_log` (warehouse/delta_log.py); the maintenance passes
(warehouse/maintenance.py) count what they did into the counters.
"""

from __future__ import annotations

import time
from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warehouse.delta_log import Checkpoint


class TableMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.partitions = Gauge("logjam_table_partitions", "Partitions of the messages table", registry=r)
        self.files = Gauge("logjam_table_files", "Data files a query of the whole table reads", registry=r)
        self.bytes = Gauge("logjam_table_bytes", "Bytes of those files", registry=r)
        self.max_files = Gauge("logjam_table_partition_files_max", "Files of the partition with the most files",
                               registry=r)
        self.files_per_partition = Histogram(
            "logjam_table_partition_files", "Files per partition (at the last census)",
            buckets=(1, 2, 4, 16, 64, 256, 1024, 4096), registry=r)
        self.bytes_per_partition = Histogram(
            "logjam_table_partition_bytes", "Bytes per partition (at the last census)",
            buckets=(2**20, 2**24, 2**27, 2**30, 2**33), registry=r)
        self.version = Gauge("logjam_table_version", "The table's latest version (commits since it was created)",
                             registry=r)
        self.log_files = Gauge("logjam_table_log_files", "Files in the table's _delta_log", registry=r)
        self.checkpoint_commits = Gauge("logjam_table_checkpoint_age_commits",
                                        "Commits since the last checkpoint (all of them when there is none)",
                                        registry=r)
        self.checkpoint_seconds = Gauge("logjam_table_checkpoint_age_seconds",
                                        "Seconds since the last checkpoint was written (0: none yet)", registry=r)
        self.bytes_read = Counter("logjam_compaction_bytes_read", "Bytes of the files compaction merged", registry=r)
        self.bytes_written = Counter("logjam_compaction_bytes_written", "Bytes of files compaction wrote", registry=r)
        self.compaction_runs = Counter("logjam_compaction_runs", "Maintenance passes that compacted", registry=r)
        self.compacted = Counter("logjam_compaction_partitions", "Partitions compacted", registry=r)
        self.compaction_failures = Counter("logjam_compaction_failures", "Partitions whose compaction failed",
                                           registry=r)
        self.compaction_seconds = Histogram("logjam_compaction_seconds", "Seconds per compaction pass",
                                            buckets=(0.1, 1, 5, 15, 60, 300, 1800), registry=r)
        self.conflicts = Counter("logjam_maintenance_conflicts",
                                 "Maintenance commits refused by the log's conflict check (tried again next pass)",
                                 ["step"], registry=r)
        self.checkpoints = Counter("logjam_table_checkpoints", "Checkpoints written", registry=r)
        self.retention_partitions = Counter("logjam_retention_partitions_dropped", "Partitions dropped by retention",
                                            registry=r)
        self.retention_rows = Counter("logjam_retention_rows_dropped", "Rows dropped by retention", registry=r)
        self.retention_bytes = Counter("logjam_retention_bytes_dropped", "Bytes of files retention removed",
                                       registry=r)
        self.vacuumed = Counter("logjam_vacuum_files_deleted", "Files VACUUM deleted", registry=r)

    def census(self, per_partition: Sequence[tuple[int, int]], version: int, checkpoint: Checkpoint | None,
               log_files: int | None) -> None:
        """Set the table's gauges and start the per-partition histograms over: `per_partition` is
        (files, bytes) of every partition of one snapshot at `version`."""
        files = [n for n, _ in per_partition]
        self.partitions.set(len(per_partition))
        self.files.set(sum(files))
        self.bytes.set(sum(b for _, b in per_partition))
        self.max_files.set(max(files, default=0))
        _refill(self.files_per_partition, files)
        _refill(self.bytes_per_partition, [b for _, b in per_partition])
        self.version.set(version)
        self.checkpoint_commits.set(version - (checkpoint.version if checkpoint else -1))
        self.checkpoint_seconds.set(max(0.0, time.time() - checkpoint.written) if checkpoint else 0.0)
        if log_files is not None:
            self.log_files.set(log_files)


def _refill(histogram: Histogram, values: Sequence[int]) -> None:
    """A census histogram describes the table now, not since start: start it over each time."""
    histogram._metric_init()  # noqa: SLF001 (prometheus_client has no public reset)
    for v in values:
        histogram.observe(v)
