"""The durable partitioned log: segments, sparse index, recovery, retention, offsets, watermark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridges.rustlog.log import (
    HEADER_SIZE,
    INDEX_ENTRY,
    BadPartitionCount,
    Log,
    LogConfig,
    PartitionNotFound,
    StorageError,
    TopicExists,
    TopicNotFound,
)

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def recs(n: int, start: int = 0, size: int = 40) -> list[bytes]:
    return [f"record-{i:06d}-".encode().ljust(size, b"x") for i in range(start, start + n)]


def partition_dir(root: Path, topic: str = "t", p: int = 0) -> Path:
    return root / "topics" / topic / str(p)


def log_bytes(root: Path, topic: str = "t", p: int = 0) -> int:
    """The bytes of a partition's segment files on disk."""
    return sum(seg.stat().st_size for seg in partition_dir(root, topic, p).glob("*.log"))


def test_offsets_are_consecutive_across_segment_rolls_and_reads_honour_max_bytes(tmp_path: Path) -> None:
    log = Log(tmp_path, SMALL)
    log.create_topic("t", 1)
    plog = log.partition("t", 0)
    assert plog.append(recs(30), timestamp=111) == 0
    assert plog.append(recs(70, 30), timestamp=222) == 30
    assert plog.high_watermark == 100 and plog.log_start_offset == 0
    assert plog.segment_count == len(list(partition_dir(tmp_path).glob("*.log"))) > 3
    for f in partition_dir(tmp_path).glob("*.log"):
        assert f.stat().st_size <= SMALL.segment_bytes
    everything = plog.read(0, 1 << 30)
    assert [r.offset for r in everything] == list(range(100))
    assert [r.payload for r in everything] == recs(100)
    assert {r.timestamp for r in everything[:30]} == {111} and {r.timestamp for r in everything[30:]} == {222}
    # Reads start anywhere, cross segments, and stop near max_bytes (at least one record).
    part = plog.read(37, 3 * (HEADER_SIZE + 40))
    assert [r.offset for r in part] == [37, 38, 39]
    assert [r.offset for r in plog.read(99, 1)] == [99]
    assert plog.read(100, 1000) == []
    log.close()


def test_the_index_is_sparse(tmp_path: Path) -> None:
    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20, index_interval_bytes=1024))
    log.create_topic("t", 1)
    log.partition("t", 0).append(recs(500))
    index = next(partition_dir(tmp_path).glob("*.index"))
    entries = index.stat().st_size // INDEX_ENTRY.size
    assert 500 * (HEADER_SIZE + 40) // 1024 - 2 <= entries <= 500 * (HEADER_SIZE + 40) // 1024 + 2
    log.close()


def test_topics_data_and_offsets_survive_reopen(tmp_path: Path) -> None:
    log = Log(tmp_path, SMALL)
    log.create_topic("a", 3)
    log.create_topic("b-2_x", 1)
    log.partition("a", 2).append(recs(50))
    log.commit("g", "a", 2, 20)
    log.commit("g", "a", 2, 25)
    log.commit("h", "b-2_x", 0, 1)
    log.partition("a", 2).set_forwarded(50)
    log.close()

    log = Log(tmp_path, SMALL)
    assert log.topics() == {"a": 3, "b-2_x": 1}
    plog = log.partition("a", 2)
    assert plog.high_watermark == 50 and plog.forwarded == 50
    assert [r.payload for r in plog.read(0, 1 << 30)] == recs(50)
    assert log.committed("g", "a", 2) == 25 and log.committed("h", "b-2_x", 0) == 1
    assert log.committed("g", "a", 1) is None
    assert plog.append([b"next"]) == 50
    # The offsets journal was compacted to one line per key.
    assert len((tmp_path / "offsets.log").read_text().splitlines()) == 2
    log.close()


def test_a_torn_tail_is_cut_at_the_last_whole_record(tmp_path: Path) -> None:
    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20))
    log.create_topic("t", 1)
    log.partition("t", 0).append(recs(10))
    log.close()
    seg = next(partition_dir(tmp_path).glob("*.log"))
    whole = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x01\x00\x00\x00\x30partial")  # a crash in the middle of an append
    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20))
    plog = log.partition("t", 0)
    assert plog.high_watermark == 10 and seg.stat().st_size == whole
    assert plog.append([b"after"]) == 10
    assert [r.payload for r in plog.read(8, 1 << 20)] == recs(2, 8) + [b"after"]
    log.close()


def test_a_corrupt_record_ends_the_active_segment(tmp_path: Path) -> None:
    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20))
    log.create_topic("t", 1)
    log.partition("t", 0).append(recs(10))
    log.close()
    seg = next(partition_dir(tmp_path).glob("*.log"))
    raw = bytearray(seg.read_bytes())
    raw[7 * (HEADER_SIZE + 40) + HEADER_SIZE + 3] ^= 0xFF  # flip a payload byte of record 7
    seg.write_bytes(raw)
    log = Log(tmp_path, LogConfig(segment_bytes=1 << 20))
    assert log.partition("t", 0).high_watermark == 7
    log.close()


def test_retention_by_size_and_age_moves_log_start(tmp_path: Path) -> None:
    log = Log(tmp_path, LogConfig(segment_bytes=1024, retention_bytes=2048))
    log.create_topic("t", 1)
    plog = log.partition("t", 0)
    for i in range(10):
        plog.append(recs(10, 10 * i))
    before = plog.segment_count
    assert log.enforce_retention() == 0  # nothing was accepted by the device yet: keep it all
    plog.set_forwarded(60)
    assert log.enforce_retention() > 0
    assert plog.log_start_offset <= 60  # only what the device has
    plog.set_forwarded(100)
    assert log.enforce_retention() > 0
    assert plog.segment_count < before and plog.log_start_offset > 0
    assert log_bytes(tmp_path) <= 2048 + 1024
    assert plog.read(plog.log_start_offset, 1 << 20)[0].offset == plog.log_start_offset
    assert plog.high_watermark == 100
    log.close()

    log = Log(tmp_path, LogConfig(segment_bytes=1024, retention_ms=1000))
    log.create_topic("age", 1)
    plog = log.partition("age", 0)
    for i in range(5):
        plog.append(recs(10, 10 * i), timestamp=1_000_000)
    assert log.enforce_retention(now=1_500_000) == 0  # nothing is a second old yet
    plog.append(recs(5, 50), timestamp=10_000_000)
    plog.set_forwarded(55)
    assert plog.enforce_retention(now=10_500_000) > 0  # every segment holding only old records goes
    start = plog.log_start_offset
    assert 0 < start <= 50 and plog.read(start, 1 << 20)[-1].offset == 54
    assert plog.enforce_retention(now=20_000_000) > 0  # now everything, the active segment included
    assert plog.log_start_offset == plog.high_watermark == 55 and plog.segment_count == 1
    assert plog.append([b"fresh"]) == 55
    log.close()
    log = Log(tmp_path, LogConfig(segment_bytes=1024))
    assert log.partition("age", 0).log_start_offset == 55
    log.close()


def test_forwarded_watermark(tmp_path: Path) -> None:
    log = Log(tmp_path, SMALL)
    log.create_topic("t", 1)
    plog = log.partition("t", 0)
    plog.append(recs(10))
    assert plog.forwarded == 0
    plog.set_forwarded(6)
    plog.set_forwarded(4)  # never backwards
    assert plog.forwarded == 6
    log.close()
    (partition_dir(tmp_path) / "forwarded").write_bytes(b"\x00\x00\x00\x00\x00\x00\x00\x09garbage!")
    log = Log(tmp_path, SMALL)
    assert log.partition("t", 0).forwarded == 0  # unreadable: forward again rather than lose
    log.close()


def test_business_errors(tmp_path: Path) -> None:
    log = Log(tmp_path, SMALL)
    log.create_topic("t", 2)
    with pytest.raises(TopicExists):
        log.create_topic("t", 1)
    with pytest.raises(BadPartitionCount):
        log.create_topic("u", 0)
    with pytest.raises(BadPartitionCount):
        log.create_topic("u", 1001)
    with pytest.raises(TopicNotFound):
        log.partition("nope", 0)
    with pytest.raises(PartitionNotFound):
        log.partition("t", 2)
    with pytest.raises(TopicNotFound):
        log.commit("g", "nope", 0, 1)
    log.close()


def test_enospc_is_a_storage_error_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    part = partition_dir(tmp_path)
    part.mkdir(parents=True)
    (tmp_path / "topics" / "t" / "topic.json").write_text('{"partition_count": 1}')
    (part / f"{0:020d}.log").symlink_to("/dev/full")
    log = Log(tmp_path, SMALL)
    with pytest.raises(StorageError) as info:
        log.partition("t", 0).append([b"x"])
    assert info.value.no_space
    assert log.partition("t", 0).high_watermark == 0
    log.close()


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_fsync_policies_all_keep_data_across_reopen(tmp_path: Path, policy: str) -> None:
    cfg = LogConfig(segment_bytes=1024, fsync=policy)
    log = Log(tmp_path, cfg)
    log.create_topic("t", 1)
    log.partition("t", 0).append(recs(40))
    log.commit("g", "t", 0, 3)
    log.sync()
    log.close()
    log = Log(tmp_path, cfg)
    assert log.partition("t", 0).high_watermark == 40 and log.committed("g", "t", 0) == 3
    log.close()
    with pytest.raises(ValueError):
        LogConfig(fsync="sometimes")


def test_a_topic_without_metadata_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "topics" / "half").mkdir(parents=True)  # a CreateTopic that crashed half way
    log = Log(tmp_path, SMALL)
    assert log.topics() == {}
    log.create_topic("half", 1)
    assert log.topics() == {"half": 1}
    log.close()
    assert os.path.exists(tmp_path / "topics" / "half" / "topic.json")


def test_a_thousand_partitions_do_not_hold_a_thousand_files_open(tmp_path: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    log = Log(tmp_path, SMALL)
    log.create_topic("wide", 1000)
    for p in (0, 500, 999):
        log.partition("wide", p).append(recs(200))  # rolls several segments each
        log.partition("wide", p).read(0, 1 << 30)
    assert open_fds() - before <= 3 * 2 + 2
    log.close()
    log = Log(tmp_path, SMALL)
    assert open_fds() - before <= 2
    assert log.partition("wide", 500).high_watermark == 200
    log.close()
    assert open_fds() == before


@pytest.mark.timeout(60)
def test_a_full_disk_undoes_an_append_that_spans_segments(tmp_path: Path) -> None:
    from tests.disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        cfg = LogConfig(segment_bytes=32 * 1024, index_interval_bytes=1024)
        log = Log(disk / "data", cfg)
        log.create_topic("t", 1)
        part = log.partition("t", 0)
        part.append(recs(10, size=1000))
        filler = fill(disk, leave=96 * 1024)
        segments, size = part.segment_count, log_bytes(disk / "data")
        # ~200 KiB over several 32 KiB segments: the first rolls fit, then the disk is full.
        with pytest.raises(StorageError) as info:
            part.append(recs(200, start=10, size=1000))
        assert info.value.no_space
        assert (part.high_watermark, part.segment_count, log_bytes(disk / "data")) == (10, segments, size)
        assert sorted(p.name for p in partition_dir(disk / "data").glob("*.log")) == [f"{0:020d}.log"]
        assert (partition_dir(disk / "data") / f"{0:020d}.log").stat().st_size == size
        filler.unlink()
        assert part.append(recs(200, start=10, size=1000)) == 10
        log.close()
        log = Log(disk / "data", cfg)
        part = log.partition("t", 0)
        assert part.high_watermark == 210
        assert [r.payload for r in part.read(0, 1 << 30)] == recs(210, size=1000)
        log.close()
