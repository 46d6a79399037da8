"""The device journal and the replay endpoint, on real files and real sockets."""

from __future__ import annotations

import threading

import pytest
import zmq

from devices.journal import Gone, Journal, JournalCorrupt
from devices.replay import ReplayServer
from logjam import Message, Meta
from logjam.replay import Lost, ReplayClient
from harness.processes import free_port

pytestmark = pytest.mark.timeout(60)


def records(first: int, n: int, size: int = 50) -> list[tuple[bytes, bytes, bytes, bytes]]:
    return [
        (b"app-test", b"logs", b'{"i":%d,"pad":"%s"}' % (s, b"x" * size), Meta(0, 7, 1000 + s, s).pack())
        for s in range(first, first + n)
    ]


def seqs(result) -> list[int]:
    return [Meta.unpack(r[3]).seq for r in result]


def test_round_trip_across_segments(tmp_path):
    j = Journal(tmp_path, segment_bytes=4096)
    for first in range(1, 1001, 100):
        j.append(first, records(first, 100))
    assert j.last_seq == 1000 and len(list(tmp_path.glob("*.journal"))) > 5
    got = []
    seq = 1
    while True:
        chunk = j.read(seq, max_count=333)
        if not chunk:
            break
        got += seqs(chunk)
        seq = got[-1] + 1
    assert got == list(range(1, 1001))
    assert seqs(j.read(555, max_count=3)) == [555, 556, 557]
    assert j.read(1001) == []
    j.close()


def test_sequence_continues_after_reopen_and_must_be_consecutive(tmp_path):
    j = Journal(tmp_path)
    j.append(1, records(1, 10))
    with pytest.raises(ValueError, match="expects seq 11"):
        j.append(13, records(13, 1))
    j.close()
    j2 = Journal(tmp_path)
    assert j2.last_seq == 10
    j2.append(11, records(11, 5))
    assert seqs(j2.read(9)) == [9, 10, 11, 12, 13, 14, 15]
    j2.close()


def test_torn_tail_is_truncated(tmp_path):
    j = Journal(tmp_path)
    j.append(1, records(1, 10))
    j.append(11, records(11, 10))
    j.close()
    seg = next(tmp_path.glob("*.journal"))
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])  # the last batch was half-written when the process died
    j2 = Journal(tmp_path)
    assert j2.last_seq == 10
    assert seg.stat().st_size < len(data) - 7
    j2.append(11, records(11, 1))
    assert seqs(j2.read(10)) == [10, 11]
    j2.close()


def test_corruption_before_the_last_segment_is_an_error(tmp_path):
    j = Journal(tmp_path, segment_bytes=1024)
    for first in range(1, 201, 20):
        j.append(first, records(first, 20))
    j.close()
    first_seg = sorted(tmp_path.glob("*.journal"))[0]
    data = bytearray(first_seg.read_bytes())
    data[30] ^= 0xFF
    first_seg.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt):
        Journal(tmp_path)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_fsync_policies(tmp_path, policy):
    j = Journal(tmp_path, fsync=policy, fsync_interval_ms=1)
    for first in range(1, 101, 10):
        j.append(first, records(first, 10))
        j.tick()
    j.close()
    assert Journal(tmp_path).last_seq == 100


def test_retention_by_size_and_age(tmp_path):
    j = Journal(tmp_path, segment_bytes=2048, retention_bytes=8192)
    for first in range(1, 1001, 50):
        j.append(first, records(first, 50))
        j.enforce_retention()
    assert j.size <= 8192 + 2048 * 2
    assert j.first_seq > 1
    assert j.read(1) == Gone(j.first_seq)
    assert seqs(j.read(j.first_seq, 1)) == [j.first_seq]
    j.retention_s = 0.0
    j.enforce_retention(now=10**12)
    assert len(list(tmp_path.glob("*.journal"))) == 1  # the active segment stays
    j.close()


def test_frames_of_any_buffer_type(tmp_path):
    j = Journal(tmp_path)
    j.append(1, [(zmq.Frame(b"app-x"), memoryview(b"logs"), zmq.Frame(b"{}"), Meta(0, 1, 5, 1).pack())])
    assert j.read(1)[0][:3] == (b"app-x", b"logs", b"{}")
    j.close()


def test_replay_endpoint_serves_ranges_and_reports_loss(tmp_path):
    j = Journal(tmp_path, segment_bytes=4096, retention_bytes=16384)
    for first in range(1, 3001, 100):
        j.append(first, records(first, 100))
        j.enforce_retention()
    ctx = zmq.Context()
    stop = threading.Event()
    port = free_port()
    server = ReplayServer(ctx, j, stop, listen=lambda sock: sock.bind(f"tcp://127.0.0.1:{port}"))
    server.start()
    assert server.bound.wait(5)
    client = ReplayClient(f"tcp://127.0.0.1:{port}", context=ctx)
    try:
        first = j.first_seq
        got = list(client.fetch(first + 10, 2990))
        assert [m.meta.seq for m in got] == list(range(first + 10, 2991))
        assert isinstance(got[0], Message) and got[0].json()["i"] == first + 10
        lost_then_data = list(client.fetch(1, first + 1))
        assert lost_then_data[0] == Lost(1, first - 1)
        assert [m.meta.seq for m in lost_then_data[1:]] == [first, first + 1]
        assert list(client.fetch(3001, 4000)) == []
    finally:
        client.close()
        stop.set()
        server.join(5)
        ctx.destroy(linger=0)
        j.close()


def test_append_encoded_writes_what_append_writes(tmp_path):
    from devices.journal import _RECORD

    recs = records(1, 30)
    body = b"".join(_RECORD.pack(len(a), len(t), len(b)) + a + t + b + m for a, t, b, m in recs)
    ja, jb = Journal(tmp_path / "a"), Journal(tmp_path / "b")
    ja.append(1, recs)
    jb.append_encoded(1, 30, memoryview(body))
    jb.append_encoded(31, 0, b"")  # an empty batch is no batch
    with pytest.raises(ValueError, match="expects seq 31"):
        jb.append_encoded(40, 1, body[: _RECORD.size + 8 + 4 + len(recs[0][2]) + 24])
    assert jb.last_seq == 30 and jb.read(1, 100) == recs
    ja.close()
    jb.close()
    assert next((tmp_path / "a").glob("*.journal")).read_bytes() == next((tmp_path / "b").glob("*.journal")).read_bytes()


def test_counters_for_metrics(tmp_path):
    j = Journal(tmp_path, fsync="always", segment_bytes=1024, retention_bytes=2048)
    for first in range(1, 201, 20):
        j.append(first, records(first, 20))
        j.enforce_retention()
    assert j.fsyncs == 10
    assert j.bytes_written > j.size > 0
    assert j.segments_deleted > 0 and j.segment_count == len(list(tmp_path.glob("*.journal")))
    j.close()


def test_the_journal_id_is_made_once_per_directory(tmp_path):
    import dataclasses
    import re

    from logjam.errors import RemoteProtocolError
    from logjam.replay import JournalChanged, JournalInfo

    j = Journal(tmp_path / "a")
    ident = j.journal_id
    assert re.fullmatch("[0-9a-f]{16}", ident)
    assert (tmp_path / "a" / "journal-id").read_text() == ident + "\n"
    j.append(1, records(1, 5))
    j.close()
    assert Journal(tmp_path / "a").journal_id == ident
    assert Journal(tmp_path / "b").journal_id != ident
    # A journal from before ids existed gets one at open, and keeps it.
    (tmp_path / "a" / "journal-id").unlink()
    older = Journal(tmp_path / "a")
    assert older.journal_id != ident and older.last_seq == 5
    assert Journal(tmp_path / "a").journal_id == older.journal_id
    info = JournalInfo(ident, 1, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.first = 2  # type: ignore[misc]
    assert not hasattr(info, "__dict__")
    assert issubclass(JournalChanged, RemoteProtocolError) and JournalChanged("a", "b", 3).reason == "journal_changed"


def test_a_failed_write_leaves_whole_batches_and_the_same_batch_can_be_written_later(tmp_path):
    from devices.journal import JournalWriteError
    from tests.disk_support import fill, small_tmpfs, torn_bytes

    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        j = Journal(disk / "j", fsync="always")
        j.append(1, records(1, 10))
        filler = fill(disk, leave=32 * 1024)
        batch = records(11, 400, size=200)  # ~100 KiB
        with pytest.raises(JournalWriteError) as failed:
            j.append(11, batch)
        assert failed.value.errno == 28
        assert str(failed.value).startswith("[Errno 28] No space left on device (") and str(failed.value).endswith(".journal)")
        assert torn_bytes(disk / "j") == {}  # cut back: no torn bytes
        assert j.last_seq == 10 and seqs(j.read(1, 100)) == list(range(1, 11))
        filler.unlink()
        j.append(11, batch)
        assert j.last_seq == 410 and seqs(j.read(1, 1000)) == list(range(1, 411))
        j.close()
        assert Journal(disk / "j").last_seq == 410
