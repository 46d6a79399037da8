"""native/decode.c (importer/decode_native.py) against the Python reference (importer/decode.py): the same
Arrow tables, results and counters for the same messages, vector by vector, byte by byte, and for
arbitrary frames (Hypothesis). Each test runs both paths itself (the C one through
`harness.native.c_module`, skipped under an outer LOGJAM_NATIVE=off) or sets the switch itself (the
importer takes the Python path under off), or tests the Python sequencer alone: none needs a run per
LOGJAM_NATIVE value."""

from __future__ import annotations

import array
import json
import random

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.lumberjack_load import body as e2e_body
from importer.batch import GroupCommit
from importer.decode import BatchBuilder
from importer.decode_native import MODULE, NativeBatchBuilder
from importer.dedupe import RecentKeys
from importer.metrics import ImporterMetrics
from importer.receive import Receiver
from importer.report import GapReport, Tally
from importer.split import StreamFilter
from logjam.compression import compress
from logjam.message import HEARTBEAT
from logjam.raw import RawBatch
from harness.native import c_module

# Marker `native`: the C decoder against its Python twin, both in every run.
pytestmark = pytest.mark.native

INGESTED_US = 1_795_000_000_123_456
CREATED_MS = 1_795_000_000_000

# (app_env, topic, frame, compression, device, created_ms, seq, journal)
Msg = tuple


def msg(body: bytes, *, compression: int = 0, app_env: str = "shop-prod", topic: str = "logs", device: int = 3,
        created_ms: int = CREATED_MS, seq: int = 1, journal: str | None = "j-1") -> Msg:
    frame = compress(compression, body) if compression else body
    return (app_env, topic, frame, compression, device, created_ms, seq, journal)


def raw_batch(msgs: list[Msg]) -> RawBatch:
    """The messages laid out as the SUB drain hands them over (logjam/raw.py)."""
    parts, pos, meta, at = [], array.array("I"), array.array("Q"), 0
    for app_env, topic, frame, compression, device, created_ms, seq, _ in msgs:
        for f in (app_env.encode(), topic.encode(), frame):
            parts.append(f)
            pos.extend((at, len(f)))
            at += len(f)
        meta.extend((compression, device, created_ms, seq))
    return RawBatch("tcp://127.0.0.1:1", b"".join(parts), pos, meta, len(msgs))


def python_path(msgs: list[Msg], dedupe: bool = True) -> tuple:
    b = BatchBuilder(dedupe=RecentKeys() if dedupe else None)
    results = [b.add_raw(*m[:7], INGESTED_US, m[7]) for m in msgs]
    return b.build(), results, b.duplicates, b.parse_errors


def picks_of(b: NativeBatchBuilder, msgs: list[Msg]) -> array.array:
    """Every message picked, in order: (index, app_env's name id, topic's, journal's or -1), as the receiver picks."""
    picks = array.array("q")
    for i, m in enumerate(msgs):
        picks.extend((i, b.name_id(m[0]), b.name_id(m[1]), b.name_id(m[7]) if m[7] is not None else -1))
    return picks


def c_path(msgs: list[Msg], dedupe: bool = True, cap: int = 8192) -> tuple:
    """The C decoder over one drained chunk, with chunks of `cap` rows (built as GroupCommit builds them)."""
    b = NativeBatchBuilder(c_module(MODULE), dedupe=RecentKeys() if dedupe else None, cap=cap)
    raw = raw_batch(msgs)
    picks = picks_of(b, msgs)
    tables, results, k, body_bytes = [], [], 0, 0
    while k < len(msgs):
        k = b.add_picks(raw, picks, k, INGESTED_US, results)
        if b.full() or k == len(msgs):
            body_bytes += b.body_bytes
            tables.append(b.build())
    by_pick = dict(results)
    table = pa.concat_tables(tables) if tables else b.build()
    return table, [by_pick.get(i) for i in range(len(msgs))], b.duplicates, b.parse_errors, body_bytes


def same(msgs: list[Msg], dedupe: bool = True, cap: int = 8192) -> pa.Table:
    """Both paths, compared whole; returns the table."""
    want, want_results, want_dups, want_errors = python_path(msgs, dedupe)
    got, got_results, got_dups, got_errors, got_body_bytes = c_path(msgs, dedupe, cap)
    assert got.schema == want.schema
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.equals(want)
    assert got_results == want_results
    assert (got_dups, got_errors) == (want_dups, want_errors)
    ref = BatchBuilder(dedupe=RecentKeys() if dedupe else None)
    for m in msgs:
        ref.add_raw(*m[:7], INGESTED_US, m[7])
    assert got_body_bytes == ref.body_bytes
    return want


def in_c_alone(msgs: list[Msg]) -> pa.Table:
    """The C decoder's rows for `msgs` from one `lj_dec_run`, which must decode every one itself,
    deferring none to the Python path (a deferred row costs the Python path and more)."""
    b = NativeBatchBuilder(c_module(MODULE), dedupe=RecentKeys())
    raw = raw_batch(msgs)
    picks = picks_of(b, msgs)
    ffi, lib = c_module(MODULE)
    done = lib.lj_dec_run(b._d, ffi.from_buffer(raw.data), len(raw.data), ffi.from_buffer("uint32_t[]", raw.pos),
                          ffi.from_buffer("uint64_t[]", raw.meta), raw.n, ffi.from_buffer("int64_t[]", picks),
                          len(msgs), INGESTED_US)
    assert (done, b._d.stop) == (len(msgs), 0)
    return b.build()


VECTORS: list[bytes] = [
    e2e_body(random.Random(1), 5),
    b'{"message":"hi","host":"web1","level":"info","action":"A#b","request_id":"r1","severity":3,"code":200,'
    b'"total_time":12.5,"@metadata":{"protocol":"courier","_id":"k1"}}',
    b'  {"message" : "spaced" , "code":-7}\n\t',
    b'{}',
    b'{"message":null,"host":null,"level":null,"severity":null,"code":null,"total_time":null}',
    b'{"message":true,"host":false,"action":0,"request_id":-0,"level":18446744073709551615}',
    b'{"message":1.5}',
    b'{"message":[1,2],"host":{"hostname":"h2"},"action":{"a":1}}',
    b'{"host":{"name":"","hostname":"h3"}}', b'{"host":{"name":0,"hostname":false}}',
    b'{"host":{"name":{},"hostname":"x"}}', b'{"host":{"name":[0]}}', b'{"host":{"name":-0,"hostname":7}}',
    b'{"host":{"name":10}}', b'{"host":{"name":0.0,"hostname":"z"}}', b'{"host":[]}',
    b'{"log":{"level":"warn"}}', b'{"log":{"offset":1},"severity":"error"}', b'{"log.level":"debug"}',
    b'{"log":"x","log.level":3,"severity":"e"}', b'{"level":5,"severity":"e"}', b'{"level":null,"severity":"e"}',
    b'{"severity":"5","code":"-12"}', b'{"severity":"--5","code":"-"}', b'{"severity":"","code":"0012"}',
    b'{"severity":"9223372036854775807","code":"-9223372036854775808"}',
    b'{"severity":"9223372036854775808","code":"-9223372036854775809"}', b'{"severity":"\\u0035"}',
    b'{"severity":"\xc2\xb2","code":"\xd9\xa3"}', b'{"severity":" 5","code":"5a"}',
    b'{"severity":9223372036854775807,"code":-9223372036854775808}',
    b'{"severity":9223372036854775808,"code":18446744073709551616}', b'{"severity":1.0,"code":true}',
    b'{"total_time":3}', b'{"total_time":-0.0}', b'{"total_time":"4.5"}', b'{"total_time":1e308}',
    b'{"total_time":18446744073709551615}', b'{"total_time":99999999999999999999}', b'{"total_time":false}',
    b'{"total_time":2.2250738585072014e-308,"x":4.9e-324}', b'{"total_time":0.1e-400}', b'{"x":1e400}',
    b'{"message":"\\u00e9\\ud83d\\ude00\\n\\t\\"\\\\\\/\\b\\f\\r\\u0000"}', b'{"message":"\\ud800"}',
    b'{"message":"\\udc00x"}', b'{"message":"\xe2\x82\xac \xf0\x9f\x98\x80"}', b'{"message":"\xed\xa0\x80"}',
    b'{"message":"\xc0\xaf"}', b'{"message":"\xff"}', b'{"message":"a\x01"}', b'{"message":"a","message":"b"}',
    b'{"mess\\u0061ge":"escaped key"}', b'{"other\\u0061":"escaped, not wanted"}',
    b'{"@metadata":{"_id":"abc","protocol":"lumberjack"}}', b'{"@metadata":{"_id":12345678901234567890}}',
    b'{"@metadata":{"_id":-0}}', b'{"@metadata":{"_id":""}}', b'{"@metadata":{"_id":1.5}}',
    b'{"@metadata":{"_id":true}}', b'{"@metadata":{"_id":"' + b"x" * 512 + b'"}}',
    b'{"@metadata":{"_id":"' + b"x" * 513 + b'"}}', b'{"@metadata":{"_id":"' + "\u00e9".encode() * 256 + b'"}}',
    b'{"@metadata":{"_id":"' + "\u00e9".encode() * 257 + b'"}}', b'{"@metadata":{"_id":"\\u0041b"}}',
    b'{"@metadata":{"_id":99999999999999999999999}}', b'{"@metadata":"text","message":"m"}',
    b'{"@metadata":{"protocol":7}}',
    b'[1,2]', b'"text"', b'42', b'null', b'', b' ', b'{', b'{"a":}', b'{"a":1,}', b'{"a":1}x', b'{"a":1}{"b":2}',
    b'\xef\xbb\xbf{}', b'{"a":01}', b'{"a":1.}', b'{"a":.5}', b'{"a":-}', b'{"a":1e}', b'{"a":NaN}',
    b'{"a":tru}', b'{"a":[1,2,]}', b'{"a":"\\x"}', b'{"a":"\\u12"}', b'{"a":"unterminated}',
    b'{"d":' + b"[" * 200 + b"]" * 200 + b"}", b'{"d":' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"a":' + b"1" * 80 + b"}", b'{"a":1' + b"0" * 400 + b"}",
]


def test_vectors_whole():
    same([msg(v, seq=i + 1) for i, v in enumerate(VECTORS)])


@pytest.mark.parametrize("compression", [1, 2, 3])
def test_compressed_bodies(compression):
    msgs = [msg(v, compression=compression, seq=i + 1) for i, v in enumerate(VECTORS[:12])]
    msgs.append(("shop-prod", "logs", b"\x00not compressed", compression, 3, CREATED_MS, 99, None))
    same(msgs)


def test_vectors_byte_by_byte_and_with_trailing_data():
    for v in VECTORS[:3]:
        same([msg(v[:n], seq=n + 1) for n in range(len(v) + 1)])
        same([msg(v + tail) for tail in (b" ", b"\n", b"x", b"{}", b"\x00", b"\xff")])


def test_event_ids_deduplicate_as_the_reference_does():
    bodies = [b'{"@metadata":{"_id":"%d"}}' % (i % 5) for i in range(40)]
    msgs = [msg(b, seq=i + 1, app_env="shop-prod" if i % 3 else "shop-test") for i, b in enumerate(bodies)]
    msgs[7] = msg(b'{"@metadata":{"_id":"\\u0032"}}', seq=8)  # deferred to Python, between C rows
    same(msgs)
    same(msgs, cap=4)
    same(msgs, dedupe=False)


def test_names_times_and_sequence_numbers():
    msgs = [msg(b"{}", app_env=a, topic=t, created_ms=c, seq=s, journal=j, device=dv)
            for a, t, c, s, j, dv in [
                ("shop-prod", "logs", CREATED_MS, 1, "j", 1), ("noenv", "t\u00e9", 0, 2**63, None, 2**32 - 1),
                ("a-b-c", "", 253_402_300_799_999, 2**64 - 1, "", 0), ("trailing-", "x", 253_402_300_800_000, 0, "j2", 5),
                ("-lead", "x", 1, 7, "j", 5), ("caf\u00e9-pr\u00f6d", "x", 86_399_999, 8, "j", 5)]]
    table = same(msgs)
    assert table.column("env").to_pylist() == ["prod", None, "c", "", "lead", "pr\u00f6d"]


def test_chunks_fill_and_go_on():
    msgs = [msg(e2e_body(random.Random(i), i), seq=i + 1) for i in range(50)]
    msgs[10] = msg(b'{"message":2.5}', seq=11)
    msgs[20] = msg(b"not json", seq=21)
    same(msgs, cap=7)
    same(msgs, cap=1)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8)
KEYS = ["message", "host", "level", "action", "request_id", "severity", "code", "total_time", "log", "log.level",
        "name", "hostname", "_id", "protocol", "x", "severity_text", "severity_number", "syslog", "trace_id", "trace",
        "trace.id", "traceId", "span_id", "span", "span.id", "spanId", "id"]
docs = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3),
                       json_values | st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3)
                       | st.sampled_from(["5", "-5", "--5", "", "12a", "\u00b2", "4.5", "9" * 25, "ab", "aBc", "AB12",
                                          "0f" * 32, "0f" * 33, "g1"])
                       | st.integers(-2, 26), max_size=6)


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=64))
    doc = draw(docs)
    if draw(st.booleans()):
        doc["@metadata"] = draw(st.dictionaries(st.sampled_from(["_id", "protocol", "x"]),
                                                json_values | st.text(max_size=6), max_size=3) | json_values)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    data = text.encode("utf-8", "surrogatepass")
    if kind == 3 and data:  # one byte changed
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return data


frames = st.tuples(bodies(), st.integers(0, 3), st.booleans(), st.sampled_from(["shop-prod", "solo", "a-\u00e9"]),
                   st.integers(0, 2**64 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames, min_size=1, max_size=8))
def test_arbitrary_frames_give_the_same_rows_or_the_same_error(items):
    c_module(MODULE)
    msgs = []
    for i, (body, compression, compressed_well, app_env, created) in enumerate(items):
        frame = compress(compression, body) if compression and compressed_well else body
        msgs.append((app_env, "logs", frame, compression, 1, created, i + 1, "j" if i % 2 else None))
    try:
        python_path(msgs)
    except Exception as e:  # the same typed error from both paths
        with pytest.raises(type(e)):
            c_path(msgs)
        return
    same(msgs)


def receiver_run(builder, raw: RawBatch) -> tuple:
    group = GroupCommit(builder, flush_interval=1.0)
    metrics = ImporterMetrics(0)
    tally = Tally()
    rec = Receiver(group, StreamFilter(prefixes=["shop"]), tally, GapReport(metrics), None, {})
    rec.receive([raw], lambda: False)
    batch = group.cut(None)
    return batch.table, tally.received, tally.skipped, tally.rows, tally.errors, tally.duplicate_events


def test_the_receive_stage_gives_the_same_batch_both_ways(monkeypatch):
    rnd = random.Random(3)
    msgs = []
    for i in range(300):
        body = e2e_body(rnd, i % 150)  # ids repeat in the same stream: duplicates
        if i % 37 == 0:
            body = b"broken"
        app = ["shop-prod", "other-prod", "shop-test"][i % 3]
        msgs.append(msg(body, app_env=app, seq=i + 1, compression=2 if i % 41 == 0 else 0, journal=None))
    msgs.insert(5, (HEARTBEAT, "", b"", 0, 3, CREATED_MS, 0, None))
    raw = raw_batch(msgs)
    built = c_module(MODULE)
    want = receiver_run(BatchBuilder(dedupe=RecentKeys()), raw)
    got = receiver_run(NativeBatchBuilder(built, dedupe=RecentKeys()), raw)
    assert want[0].column("ingested_at").to_pylist() != []
    assert got[0].drop(["ingested_at"]).equals(want[0].drop(["ingested_at"]))
    assert got[1:] == want[1:]
    assert sum(want[5].values()) > 0 and sum(want[4].values()) > 0


def test_switched_off_the_importer_takes_the_python_path(monkeypatch):
    monkeypatch.setenv("LOGJAM_NATIVE", "off")
    assert NativeBatchBuilder.load() is None


def test_e2e_bodies_are_decoded_in_c_not_deferred():
    """The bodies the mesh carries take the C path."""
    table = in_c_alone([msg(e2e_body(random.Random(i), i), seq=i + 1) for i in range(100)])
    assert orjson.loads(table.column("body")[0].as_py())["@metadata"]["_id"]


class FillingSequencer:
    """A sequencer whose check hands on one replayed message before seq 50 (as a hole's fill does):
    the rows must keep that order on both paths."""

    def __init__(self) -> None:
        from importer.sequence import Ledger
        self.ledger = Ledger()

    def take_in_order(self, meta, n: int) -> bool:
        return False  # every message goes through check()

    def check(self, device: int, seq: int, handle) -> bool:
        if seq == 50:
            from logjam.message import Message
            handle(Message.build("shop-prod", "logs", {"message": "replayed", "@metadata": {"_id": "r"}},
                                 seq=10_000, device=device, created_ms=CREATED_MS), "j-replay")
        self.ledger.cover(device, seq)
        return True


def test_a_message_handed_on_mid_chunk_keeps_its_place():
    msgs = [msg(b'{"message":"m%d"}' % i, seq=i + 1, journal=None) for i in range(100)]
    raw = raw_batch(msgs)

    def run(builder):
        group = GroupCommit(builder, flush_interval=1.0)
        tally = Tally()
        rec = Receiver(group, StreamFilter(), tally, GapReport(ImporterMetrics(0)), FillingSequencer(), {})
        rec.receive([raw], lambda: False)
        return group.cut(None).table, tally.rows

    want, want_rows = run(BatchBuilder(dedupe=RecentKeys()))
    got, got_rows = run(NativeBatchBuilder(c_module(MODULE), dedupe=RecentKeys()))
    assert want.column("message").to_pylist()[48:51] == ["m48", "replayed", "m49"]
    assert got.drop(["ingested_at"]).equals(want.drop(["ingested_at"]))
    assert got_rows == want_rows == {"shop-prod": 101}


@pytest.mark.parametrize("kind", ["array", "list"])
def test_a_chunk_in_order_is_sequenced_at_once_and_anything_else_message_by_message(kind):
    """`Sequencer.take_in_order`: one known device, each seq exactly the next -> covered at once; a hole,
    a duplicate, another device or an unknown one -> False, the ledger untouched (check() decides)."""
    import array

    import zmq

    from importer.metrics import ImporterMetrics
    from importer.sequence import Ledger, Position, Sequencer

    def meta(rows):
        flat = [v for device, seq in rows for v in (0, device, CREATED_MS, seq)]
        return array.array("Q", flat) if kind == "array" else flat

    ledger = Ledger({3: Position("j", 10), 4: Position("j", 0)})
    seq = Sequencer(ledger, ImporterMetrics(0), context=zmq.Context.instance(), device_endpoint={},
                    replay_port=1, replay_timeout=1.0, stopping=lambda: False)
    assert seq.take_in_order(meta([(3, s) for s in range(11, 21)]), 10)
    assert ledger.seq(3) == 20 and ledger.journal(3) == "j"
    for rows in ([(3, 21), (3, 23), (3, 23), (3, 24)],  # a hole and a duplicate, first and last as if in order
                 [(3, 22)],  # a hole
                 [(3, 20), (3, 21)],  # a duplicate first
                 [(3, 21), (4, 1)],  # two devices
                 [(5, 1)],  # a device without a position
                 [(0, 1)]):  # an untracked producer
        assert not seq.take_in_order(meta(rows), len(rows)), rows
    assert ledger.seq(3) == 20 and ledger.seq(5) == -1
    stopping = Sequencer(ledger, ImporterMetrics(0), context=zmq.Context.instance(), device_endpoint={},
                         replay_port=1, replay_timeout=1.0, stopping=lambda: True)
    assert not stopping.take_in_order(meta([(3, 21)]), 1)


# Each byte the string readers stop at (native/lj_json.h `lj_plain_run`, eight bytes a step),
# and bytes next to them that they must pass: at every offset of a word, in a key and in values.
RUN_BYTES = [b'\\"', b"\\\\", b"\\n", b"\\u00e9", "é".encode(), "€".encode(), "😀".encode(), b"\x1f", b"\x7f",
             b" ", b"!", b"#", b"[", b"]", b"\x80", b"\xc3", b"\x00", b'"']


@pytest.mark.parametrize("special", RUN_BYTES, ids=lambda b: b.hex())
def test_strings_with_a_stop_byte_at_every_offset_read_as_in_python(special: bytes) -> None:
    c_module(MODULE)
    msgs = []
    for at in range(18):
        text = b"a" * at + special + b"b" * (17 - at)
        body = b'{"message":"' + text + b'","k' + text[:at] + b'":1,"@metadata":{"_id":"' + text + b'"}}'
        msgs.append(msg(body, seq=at + 1))
    same(msgs)
