"""The durable segment store: Pravega's bytes on disk, writer state and the forwarded
watermark across reopen, torn-tail recovery, fsync policies, reads and sealing."""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from pathlib import Path

import pytest

from bridges.segment import engine as wire
from bridges.segment.store import NULL_EVENT_NUMBER, RECORD_SIZE, SegmentExists, SegmentStore, dir_name

W1 = uuid.UUID(int=1)
W2 = uuid.UUID(int=2)
SEG = "scope/stream/0.#epoch.0"


def events(*payloads: bytes) -> bytes:
    return b"".join(wire.event_bytes(p) for p in payloads)


def run(coro):
    return asyncio.run(coro)


def reopen(root: Path, fsync: str = "always") -> SegmentStore:
    store = SegmentStore(root, fsync)
    store.open()
    return store


@pytest.mark.timeout(30)
def test_append_read_and_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        store = reopen(tmp_path)
        seg = store.create(SEG)
        with pytest.raises(SegmentExists):
            store.create(SEG)
        assert seg.last_event(W1) == NULL_EVENT_NUMBER
        r1 = seg.append(W1, events(b"a", b"bb"), 2, 2)
        r2 = seg.append(W2, events(b"ccc"), 1, 7)
        r3 = seg.append(W1, events(b"d"), 1, 3)
        assert (r1.start, r1.end, r2.start, r2.end, r3.end) == (0, 19, 19, 30, 39)
        # Under fsync=always nothing is readable (or reported durable) before the sync.
        assert seg.read(0, 100) == (b"", True, False)
        await seg.sync(r3.end)
        assert seg.durable == 39
        data, tail, end = seg.read(0, 100)
        assert data == events(b"a", b"bb", b"ccc", b"d") and tail and not end
        assert seg.read(9, 10) == (events(b"bb"), False, False)  # from the middle, limited length
        assert seg.read(39, 10) == (b"", True, False)  # at the tail
        store.close()

    run(main())
    store = reopen(tmp_path)
    seg = store.get(SEG)
    assert seg is not None and seg.length == 39
    assert seg.last_event(W1) == 3 and seg.last_event(W2) == 7
    assert (tmp_path / "segments" / dir_name(SEG) / "data").read_bytes() == events(b"a", b"bb", b"ccc", b"d")
    store.close()


@pytest.mark.timeout(30)
def test_torn_appends_are_cut_off_at_open(tmp_path: Path) -> None:
    store = reopen(tmp_path, "never")
    seg = store.create(SEG)
    seg.append(W1, events(b"one"), 1, 1)
    seg.append(W1, events(b"two"), 1, 2)
    store.close()
    path = tmp_path / "segments" / dir_name(SEG)
    # A crash after the data write but before the index record: unindexed bytes.
    with open(path / "data", "ab") as f:
        f.write(events(b"three"))
    store = reopen(tmp_path)
    seg = store.get(SEG)
    assert seg.length == 22 and seg.last_event(W1) == 2
    assert (path / "data").stat().st_size == 22
    seg.append(W1, events(b"three"), 1, 3)
    store.close()
    # A torn index record, and a record whose data was not all written (machine crash).
    with open(path / "index", "ab") as f:
        f.write(b"\x00" * (RECORD_SIZE // 2))
    store = reopen(tmp_path)
    assert store.get(SEG).length == 35 and (path / "index").stat().st_size == 3 * RECORD_SIZE
    store.close()
    raw = bytearray((path / "data").read_bytes())
    raw[-1] ^= 0xFF  # the last append's bytes do not match its CRC
    (path / "data").write_bytes(bytes(raw))
    store = reopen(tmp_path)
    seg = store.get(SEG)
    assert seg.length == 22 and seg.last_event(W1) == 2
    assert seg.read(0, 100)[0] == events(b"one", b"two")
    store.close()


@pytest.mark.timeout(30)
def test_forwarded_watermark_out_of_order_and_after_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        store = reopen(tmp_path, "never")
        seg = store.create(SEG)
        recs = [seg.append(W1, events(b"x" * i), 1, i) for i in range(1, 5)]
        assert seg.forwarded == 0 and seg.unforwarded() == recs
        seg.mark_forwarded(recs[1])  # the device answered the second append first
        assert seg.forwarded == 0
        waiter = asyncio.ensure_future(seg.wait_forwarded(recs[1].end))
        await asyncio.sleep(0)
        assert not waiter.done()
        seg.mark_forwarded(recs[0])
        assert seg.forwarded == recs[1].end
        await asyncio.wait_for(waiter, 5)
        store.close()
        return recs

    recs = run(main())
    store = reopen(tmp_path)
    seg = store.get(SEG)
    assert seg.forwarded == recs[1].end
    assert seg.unforwarded() == recs[2:]  # recovery forwards exactly these
    seg.mark_forwarded(seg.unforwarded()[0])
    seg.mark_forwarded(seg.unforwarded()[0])
    assert seg.forwarded == seg.length and seg.unforwarded() == []
    store.close()
    assert reopen(tmp_path).get(SEG).unforwarded() == []


@pytest.mark.timeout(30)
def test_watermark_file_is_compacted_and_a_torn_mark_ignored(tmp_path: Path) -> None:
    store = reopen(tmp_path, "never")
    seg = store.create(SEG)
    for i in range(7000):
        seg.mark_forwarded(seg.append(W1, events(b"e"), 1, i + 1))
    path = tmp_path / "segments" / dir_name(SEG) / "forwarded"
    assert path.stat().st_size < 64 * 1024 + 12
    store.close()
    with open(path, "ab") as f:
        f.write(struct.pack(">QI", 5, 0))  # a mark with a bad CRC
    assert reopen(tmp_path).get(SEG).forwarded == 7000 * 9


@pytest.mark.timeout(30)
def test_fsync_policies_and_group_commit(tmp_path: Path) -> None:
    async def main() -> None:
        for policy in ("always", "interval", "never"):
            store = SegmentStore(tmp_path / policy, policy)
            store.open()
            seg = store.create(SEG)
            recs = [seg.append(W1, events(b"p"), 1, i + 1) for i in range(50)]
            if policy == "always":
                assert seg.durable == 0
                await asyncio.gather(*(seg.sync(r.end) for r in recs))
            assert seg.durable == seg.length == 50 * 9
            await store.flush()
            store.close()
        with pytest.raises(ValueError):
            SegmentStore(tmp_path, "sometimes")

    run(main())


@pytest.mark.timeout(30)
def test_seal_sets_end_of_segment_and_survives_reopen(tmp_path: Path) -> None:
    store = reopen(tmp_path, "never")
    seg = store.create(SEG)
    seg.append(W1, events(b"abc", b"de"), 2, 2)
    seg.seal()
    assert seg.read(0, 11) == (events(b"abc"), False, False)
    assert seg.read(0, 100) == (events(b"abc", b"de"), True, True)
    store.close()
    seg = reopen(tmp_path).get(SEG)
    assert seg.sealed and seg.read(seg.length, 10) == (b"", True, True)


@pytest.mark.timeout(30)
def test_odd_and_long_names(tmp_path: Path) -> None:
    names = ["..", ".", "a/b/../c", "spaces and \u00e9\U0001F600", "x" * 1000, "nul\x00name"]
    store = reopen(tmp_path, "never")
    for name in names:
        store.create(name).append(W1, events(name.encode("utf-8", "surrogatepass")), 1, 1)
    assert len(set(os.listdir(tmp_path / "segments"))) == len(names)
    store.close()
    store = reopen(tmp_path)
    assert sorted(store.segments) == sorted(names)
    for name in names:
        assert store.get(name).read(0, 5000)[0] == events(name.encode("utf-8", "surrogatepass"))


@pytest.mark.timeout(60)
def test_a_full_disk_fails_the_append_whole_and_the_next_one_works(tmp_path: Path) -> None:
    from bridges.segment.store import StoreError
    from tests.disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        store = reopen(disk / "data")
        seg = store.create(SEG)
        seg.append(W1, events(b"first"), 1, 1)
        filler = fill(disk, leave=64 * 1024)
        big = events(*(b"y" * 1000 for _ in range(200)))  # ~200 KiB: more than is left
        with pytest.raises(StoreError, match="No space left on device"):
            seg.append(W1, big, 200, 201)
        # Nothing of it stayed: the files hold exactly the first append, and the writer is where it was.
        assert seg.length == len(events(b"first")) and seg.last_event(W1) == 1
        assert (seg.path / "data").stat().st_size == seg.length
        assert (seg.path / "index").stat().st_size == RECORD_SIZE
        with pytest.raises(StoreError):
            seg.append(W1, big, 200, 201)  # and again, while the disk stays full
        filler.unlink()
        rec = seg.append(W1, big, 200, 201)
        assert rec.start == len(events(b"first")) and seg.last_event(W1) == 201
        store.close()
        store = reopen(disk / "data")
        again = store.get(SEG)
        assert again is not None and again.length == rec.end and again.last_event(W1) == 201
        assert again.read(0, rec.end)[0] == events(b"first") + big
        store.close()
