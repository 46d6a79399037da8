"""The event -> Logjam message mapping every bridge shares."""

import datetime

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.host.mapping import EventMapper, Positions, body_and_raw, body_from_bytes, parse_timestamp
from logjam.message import Message
from logjam.meta import Compression


@pytest.mark.parametrize(
    "data, body",
    [
        (b'{"message":"hi","n":1}', {"message": "hi", "n": 1}),
        (b"plain text", {"message": "plain text"}),
        (b"[1,2]", {"message": "[1,2]"}),
        (b"\xff\xfe", {"message_base64": "//4="}),
        ("héllo".encode(), {"message": "héllo"}),
    ],
)
def test_body_from_bytes(data, body):
    assert body_from_bytes(data) == body


@pytest.mark.parametrize(
    "value, ms",
    [
        ("2024-01-02T03:04:05.678Z", 1704164645678),
        ("2024-01-02T03:04:05.678+01:00", 1704164645678 - 3600_000),
        ("2024-01-02T03:04:05", 1704164645000),
        (1700000000, 1700000000000),
        (1700000000.5, 1700000000500),
        (1700000000123, 1700000000123),
        ("yesterday", None),
        (True, None),
        (None, None),
        (-5, None),
    ],
)
def test_parse_timestamp(value, ms):
    assert parse_timestamp(value) == ms


def one_message(mapper: EventMapper, body: dict, metadata: dict, **kw) -> Message:
    out = mapper.batches()
    mapper.add(out, body, metadata, **kw)
    [msg] = out.messages()
    return msg


def test_message_adds_metadata_and_timestamp():
    fallbacks = []
    m = EventMapper(app_env="lj-default", topic="logs.lumberjack", app_env_field="fields.app",
                    on_fallback=lambda: fallbacks.append(1), instance="b1")
    msg = one_message(m, 
        {"message": "x", "@timestamp": "2024-01-02T03:04:05.678Z", "fields": {"app": "shop-prod"}, "@metadata": {"beat": "filebeat"}},
        {"protocol": "lumberjack", "seq": 3},
        created_ms=5,
    )
    assert msg.app_env == "shop-prod" and msg.topic == "logs.lumberjack"
    assert msg.meta.created_ms == 1704164645678
    assert orjson.loads(msg.body)["@metadata"] == {"beat": "filebeat", "protocol": "lumberjack", "seq": 3, "_id": "b1:1"}
    assert fallbacks == []


def test_idempotency_key_client_then_bridge_position_then_counter():
    m = EventMapper(app_env="a-b", topic="logs", instance="inst")
    shared = {"protocol": "p"}
    keys = [
        orjson.loads(one_message(m, body, meta).body)["@metadata"]["_id"]
        for body, meta in [
            ({"@metadata": {"_id": "fp-1"}}, shared),          # the client's key wins
            ({"@metadata": {"_id": "fp-2"}}, {"_id": "pos"}),  # ... even over the bridge's position
            ({}, {"_id": "seg@7"}),                            # a stored position
            ({"@metadata": {"_id": 5}}, shared),               # not a usable key: ours
            ({}, shared),
            ({"@metadata": {}}, shared),
        ]
    ]
    assert keys == ["fp-1", "fp-2", "seg@7", "inst:1", "inst:2", "inst:3"]
    assert shared == {"protocol": "p"}, "the caller's metadata dict is never changed"
    assert EventMapper(app_env="a-b", topic="t").instance != EventMapper(app_env="a-b", topic="t").instance


def test_batches_split_on_app_env_and_keep_order():
    m = EventMapper(app_env="dflt-x", topic="logs", app_env_field="app", compression=Compression.ZLIB)
    out = m.batches()
    for i, app in enumerate(["a-x", "a-x", "b-x", "a-x"]):
        m.add(out, {"app": app, "i": i}, {}, created_ms=100 + i)
    assert len(out) == 4
    assert [(b.app_env, len(b)) for b in out.batches] == [("a-x", 2), ("b-x", 1), ("a-x", 1)]
    msgs = out.messages()
    assert [msg.json()["i"] for msg in msgs] == [0, 1, 2, 3]
    assert [msg.meta.created_ms for msg in msgs] == [100, 101, 102, 103]
    assert all(msg.meta.compression == Compression.ZLIB and msg.meta.seq == 0 for msg in msgs)


@pytest.mark.parametrize("fields", [{}, {"app": 7}, {"app": "noenv"}, {"app": "bad\x01-x"}])
def test_invalid_app_env_field_falls_back_and_counts(fields):
    fallbacks = []
    m = EventMapper(app_env="lj-default", topic="logs", app_env_field="fields.app", on_fallback=lambda: fallbacks.append(1))
    msg = one_message(m, {"fields": fields}, {}, created_ms=42)
    assert msg.app_env == "lj-default" and msg.meta.created_ms == 42 and fallbacks == [1]


def test_compression_and_override():
    m = EventMapper(app_env="a-b", topic="logs", compression=Compression.LZ4)
    msg = one_message(m, {"message": "y" * 100}, {"protocol": "t"}, app_env="c-d")
    assert msg.app_env == "c-d" and msg.meta.compression == Compression.LZ4
    assert msg.json()["message"] == "y" * 100


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(st.text(max_size=10), _json, max_size=6),
    metadata=st.dictionaries(st.sampled_from(["protocol", "peer", "seq", "_id"]), st.text(max_size=5) | st.integers(0, 9)),
    indent=st.booleans(),
    trailing=st.sampled_from([b"", b" ", b"\n", b"\r\n\t "]),
)
def test_spliced_body_is_the_same_json_as_reencoding(body, metadata, indent, trailing):
    """`add(raw=...)` must give exactly what re-encoding the dict gives, key order included."""
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2 if indent else 0) + trailing
    fast, slow = EventMapper(app_env="a-b", topic="t", instance="i"), EventMapper(app_env="a-b", topic="t", instance="i")
    out_fast, out_slow = fast.batches(), slow.batches()
    fast.add(out_fast, orjson.loads(raw), dict(metadata), created_ms=7, raw=raw)
    slow.add(out_slow, orjson.loads(raw), dict(metadata), created_ms=7)
    got, want = out_fast.messages()[0], out_slow.messages()[0]
    assert list(orjson.loads(got.body).items()) == list(orjson.loads(want.body).items())
    assert got.meta == want.meta and got.app_env == want.app_env


_timestamps = st.one_of(
    st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31),
                 timezones=st.none() | st.just(datetime.timezone.utc)
                 | st.builds(lambda m: datetime.timezone(datetime.timedelta(minutes=m)), st.integers(-1439, 1439)))
    .map(lambda d: d.isoformat(timespec=["auto", "seconds", "milliseconds", "microseconds"][d.microsecond % 4])),
    st.sampled_from(["2024-05-01T12:00:00.123Z", "2024-05-01T12:00:00Z", "2024-02-30T00:00:00Z", "2024-05-01 12:00:00",
                     "2024-05-01T12:00:00.1234567Z", "2024-05-01T12:00:00+0100", " 2024-05-01T12:00:00Z", "1970-01-01T00:00:00Z",
                     "2024-05-01T24:00:00Z", "2024-05-01T12:00:60Z", "2024-05-01", "x", "", "2024-05-01T12:00:00z"]),
    st.integers(-5, 2**62) | st.floats(allow_nan=False) | st.none() | st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.dictionaries(st.text(max_size=6).filter(lambda k: k != "@metadata"), _json, min_size=1, max_size=4),
                  _timestamps | st.none(), st.booleans(), st.integers(0, 2**40)),
        min_size=1, max_size=6),
    common=st.dictionaries(st.sampled_from(["protocol", "peer", "tls", "nonce"]), st.text(max_size=5) | st.integers(0, 9)),
    fields=st.sampled_from([("", ""), ("seq", ""), ("event_number", "segment_offset")]),
    own_keys=st.booleans(),
)
def test_spliced_run_is_exactly_add_per_event(events, common, fields, own_keys):
    """`add_payloads` with parsed bodies (the batch splice) must give byte-for-byte what `add` gives each event."""
    f1, f2 = fields
    bodies, raws, v1, v2 = [], [], [], []
    for body, ts, nested, v in events:
        body = dict(body)
        if ts is not None:
            if nested:  # a nested @timestamp must not be taken for the top-level one
                body = {"inner": {"@timestamp": ts}, **body}
            else:
                body["@timestamp"] = ts
        raw = orjson.dumps(body)
        bodies.append(orjson.loads(raw))
        raws.append(raw)
        v1.append(v)
        v2.append(v + 1)
    keys = [v * 3 for v in v1] if own_keys else None
    fast, slow = EventMapper(app_env="a-b", topic="t", instance="i"), EventMapper(app_env="a-b", topic="t", instance="i")
    out_fast, out_slow = fast.batches(), slow.batches()
    fast.add_payloads(out_fast, raws, common, Positions(f1, v1, f2, v2, "seg:x@" if own_keys else "", keys),
                      bodies=bodies, created_ms=77)
    for i, (body, raw) in enumerate(zip(bodies, raws)):
        meta = dict(common)
        if f1:
            meta[f1] = v1[i]
        if f2:
            meta[f2] = v2[i]
        meta["_id"] = f"seg:x@{keys[i]}" if own_keys else f"i:{i + 1}"
        slow.add(out_slow, orjson.loads(raw), meta, created_ms=77)
    got, want = out_fast.messages(), out_slow.messages()
    assert [m.body for m in got] == [orjson.dumps(orjson.loads(m.body)) for m in want]
    assert [m.meta.created_ms for m in got] == [m.meta.created_ms for m in want]
    assert fast._next_n == 1 + (0 if own_keys else len(events))


def test_add_payloads_mixes_runs_and_single_events_in_order():
    payloads = [b'{"a":1,"@timestamp":"2024-01-02T03:04:05.678Z"}', b"plain text", b'{"b":2}', b"{}",
                b'{"@metadata":{"_id":"client"},"c":3}', b"\xff\xfe", b'{"d":4}  \n', b"[1,2]"]
    m = EventMapper(app_env="a-b", topic="t", instance="i")
    out = m.batches()
    m.add_payloads(out, payloads, {"protocol": "x"}, Positions("offset", range(10, 18), key_prefix="log@", keys=range(10, 18)),
                   created_ms=9)
    got = [(orjson.loads(msg.body), msg.meta.created_ms) for msg in out.messages()]
    meta = lambda k, **extra: {**extra, "protocol": "x", "offset": k, "_id": f"log@{k}"}  # noqa: E731
    assert got == [
        ({"a": 1, "@timestamp": "2024-01-02T03:04:05.678Z", "@metadata": meta(10)}, 1704164645678),
        ({"message": "plain text", "@metadata": meta(11)}, 9),
        ({"b": 2, "@metadata": meta(12)}, 9),
        ({"@metadata": meta(13)}, 9),
        ({"@metadata": {"_id": "client", "protocol": "x", "offset": 14}, "c": 3}, 9),
        ({"message_base64": "//4=", "@metadata": meta(15)}, 9),
        ({"d": 4, "@metadata": meta(16)}, 9),
        ({"message": "[1,2]", "@metadata": meta(17)}, 9),
    ]


def test_parsed_payloads_without_the_splice_give_the_same_events():
    """With compression (or --app-env-field) add_payloads maps event by event in Python: same JSON, same keys."""
    raws = [b'{"a":1,"@timestamp":"2024-01-02T03:04:05.678Z"}', b'{"b":"x"}  ', b'{"c":[1,{"@timestamp":5}]}']
    bodies = [orjson.loads(r) for r in raws]
    native = EventMapper(app_env="a-b", topic="t", instance="i")
    python = EventMapper(app_env="a-b", topic="t", instance="i", compression=Compression.ZLIB)
    outs = []
    for m in (native, python):
        out = m.batches()
        m.add_payloads(out, raws, {"protocol": "p"}, Positions("seq", [4, 5, 6]), bodies=[dict(b) for b in bodies],
                       created_ms=9)
        outs.append([(list(msg.json().items()), msg.meta.created_ms) for msg in out.messages()])
    assert outs[0] == outs[1]
    assert [meta for items, _ in outs[1] for key, meta in items if key == "@metadata"] == [
        {"protocol": "p", "seq": s, "_id": f"i:{k}"} for s, k in ((4, 1), (5, 2), (6, 3))
    ]
    assert [created for _, created in outs[1]] == [1704164645678, 9, 9]


_pool_timestamps = st.sampled_from([True, 1, 1.0, 0, "2024-05-01T12:00:00Z", "2024-05-01T12:00:00.5Z", "x", None])
_texts = st.one_of(
    st.tuples(st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), min_size=1, max_size=2), _pool_timestamps,
              st.sampled_from([b"", b" \n"])).map(
        lambda t: orjson.dumps({**t[0], **({} if t[1] is None else {"@timestamp": t[1]})}) + t[2]),
    st.sampled_from([b"plain text", b"{}", b"[1]", b"\xff", b'{"@metadata":{"_id":"own"},"x":1}',
                     b'{"@metadata":{"k":1},"@timestamp":1}']),
)


@settings(max_examples=400, deadline=None)
@given(payloads=st.lists(_texts, min_size=1, max_size=10))
def test_add_payloads_without_positions_is_add_per_event(payloads):
    """The splice numbers its events from the mapper's counter and reuses a repeated text
    timestamp (never a 1 after a True): byte for byte what `add` gives each payload in turn."""
    common = {"protocol": "p"}
    fast, slow = EventMapper(app_env="a-b", topic="t", instance="i"), EventMapper(app_env="a-b", topic="t", instance="i")
    out_fast, out_slow = fast.batches(), slow.batches()
    fast.add_payloads(out_fast, payloads, common, created_ms=9)
    for raw in payloads:
        body, same = body_and_raw(raw)
        slow.add(out_slow, body, dict(common), created_ms=9, raw=same)
    got, want = out_fast.messages(), out_slow.messages()
    assert [m.body for m in got] == [orjson.dumps(orjson.loads(m.body)) for m in want]
    assert [m.meta.created_ms for m in got] == [m.meta.created_ms for m in want]
    assert fast._next_n == slow._next_n
