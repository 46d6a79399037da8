"""Pure tests of the importer's event-id dedupe: the bounded key memory and the `event_id` column (no Spark)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from importer.decode import DUPLICATE_EVENT, MAX_EVENT_ID_BYTES, BatchBuilder, event_id, stream_key
from importer.decode_native import MODULE, NativeRecentKeys
from importer.dedupe import DEFAULT_CAPACITY, RecentKeys
from harness.native import c_module
from logjam.message import Message
from logjam.meta import Compression

NOW_US = 1_763_700_000_123_456


def repeats(memory: RecentKeys | NativeRecentKeys, keys: list[str | None]) -> list[int]:
    """`seen` for each key in order, as the decoder asks per row (None and "" are no key): the indices of
    the keys seen before."""
    return [i for i, key in enumerate(keys) if key and memory.seen(key)]


def remembered(keys: RecentKeys, candidates: str = "abcdefghijtuvwxyz") -> set[str]:
    """Which of `candidates` `keys` remembers, asked through `in` (which neither adds nor refreshes)."""
    return {k for k in candidates if k in keys}


def test_a_key_is_new_once_then_a_duplicate() -> None:
    keys = RecentKeys(3)
    assert not keys.seen("a")
    assert keys.seen("a") and keys.seen("a")
    assert not keys.seen("b")
    assert len(keys) == 2 and "a" in keys and "c" not in keys


def test_the_bound_is_respected_and_the_oldest_key_is_forgotten_first() -> None:
    keys = RecentKeys(3)
    for k in "abc":
        assert not keys.seen(k)
    assert not keys.seen("d")  # evicts a, the oldest
    assert len(keys) == 3 and remembered(keys) == {"b", "c", "d"}
    assert "a" not in keys
    # A repeat does not refresh a key: eviction follows first sight, like the order rows were written.
    assert keys.seen("b")
    assert not keys.seen("e")  # evicts b
    assert remembered(keys) == {"c", "d", "e"}
    assert not keys.seen("a")  # forgotten, so new again (a duplicate older than the bound lands twice)
    assert remembered(keys) == {"d", "e", "a"} and len(keys) == 3
    assert not keys.seen("f")  # evicts c, then d, then e: first sight order, a's return last
    assert not keys.seen("g")
    assert not keys.seen("h")
    assert remembered(keys) == {"f", "g", "h"}


def test_extend_loads_oldest_first_and_skips_repeats() -> None:
    keys = RecentKeys(4)
    assert keys.extend(["x", "y", "x", "z", "w", "v"]) == 5
    assert remembered(keys) == {"y", "z", "w", "v"}
    # New keys push them out in the order they were loaded: y is the oldest, v the newest.
    for new, left in [("a", {"z", "w", "v"}), ("b", {"w", "v"}), ("c", {"v"}), ("d", set())]:
        assert not keys.seen(new)
        assert remembered(keys) - {"a", "b", "c", "d"} == left


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.lists(st.sampled_from("abcdefghij"), max_size=60))
def test_behaves_like_a_fifo_window_of_distinct_keys(capacity: int, stream: list[str]) -> None:
    keys = RecentKeys(capacity)
    window: list[str] = []  # the reference: a plain list
    for k in stream:
        dup = k in window
        assert keys.seen(k) == dup
        if not dup:
            window.append(k)
            if len(window) > capacity:
                window.pop(0)
        # The same keys at every step is the same order: the order shows only in which key goes next.
        assert remembered(keys) == set(window) and len(keys) == len(window) <= capacity


def test_capacity_must_be_positive() -> None:
    assert RecentKeys().capacity == DEFAULT_CAPACITY
    with pytest.raises(ValueError):
        RecentKeys(0)


def test_the_c_memory_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        NativeRecentKeys(c_module(MODULE), 0)


# Keys that share prefixes, lengths and bytes (NUL, non-ASCII, the empty key), for the C twin;
# 56 bytes is the longest a ring entry of native/dedupe.c holds itself, longer ones are copied.
TWIN_KEY_LIST = ["a", "b", "ab", "ba", "a\0b", "a\0c", "", "é", "e\u0301", "x" * 40, "x" * 41,
                 "y" * 56, "y" * 57, "y" * 55 + "é", "y" * 300, "y" * 299 + "z",
                 "shop-prod\0" + "3f9c0a1b2c3d4e5f:1", "shop-prod\0" + "3f9c0a1b2c3d4e5f:2"]
TWIN_KEYS = st.sampled_from(TWIN_KEY_LIST)
TWIN_OPS = st.one_of(st.tuples(st.just("seen"), TWIN_KEYS), st.tuples(st.just("in"), TWIN_KEYS),
                     st.tuples(st.just("extend"), st.lists(TWIN_KEYS, max_size=6)),
                     st.tuples(st.just("repeats"), st.lists(st.one_of(st.none(), TWIN_KEYS), max_size=6)))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.lists(TWIN_OPS, max_size=80))
def test_the_c_memory_answers_as_its_python_twin(capacity: int, ops: list) -> None:
    """native/dedupe.c against importer/dedupe.py: every answer, the length and what is remembered."""
    twin, c = RecentKeys(capacity), NativeRecentKeys(c_module(MODULE), capacity)
    for op, arg in ops:
        if op == "in":
            assert (arg in c) == (arg in twin)
        elif op == "repeats":
            assert repeats(c, arg) == repeats(twin, arg), arg
        else:
            assert getattr(c, op)(arg) == getattr(twin, op)(arg), (op, arg)
        assert len(c) == len(twin)
    assert {k for k in TWIN_KEY_LIST if k in c} == set(twin.oldest_first())


def test_the_c_memory_keeps_its_bound_over_many_keys() -> None:
    """Many evictions through a table that wraps around: the last `capacity` keys, no other, exactly."""
    capacity = 1000
    twin, c = RecentKeys(capacity), NativeRecentKeys(c_module(MODULE), capacity)
    keys = [f"s{i % 7}-prod\0id-{i * 7919 % 5003}" + "-long" * (i % 3 == 0) * 12 for i in range(20_000)]
    assert repeats(c, keys) == repeats(twin, keys)
    assert len(c) == len(twin) == capacity
    assert all(k in c for k in twin.oldest_first())
    assert not any(k in c for k in set(keys) - set(twin.oldest_first()))
    # Reloaded oldest first (as the importer reloads what it wrote), both forget in the same order.
    again, twin_again = NativeRecentKeys(c_module(MODULE), capacity), RecentKeys(capacity)
    assert again.extend(twin.oldest_first()) == twin_again.extend(twin.oldest_first()) == capacity
    more = [f"s{i % 5}-prod\0id-{i * 31 % 1500}" for i in range(5000)]
    assert repeats(again, more) == repeats(twin_again, more)


@pytest.mark.parametrize(("value", "key"), [
    ("abc:17", "abc:17"),
    (42, "42"),
    (-7, "-7"),
    (2**64 - 1, "18446744073709551615"),
    ("é" * 256, "é" * 256),  # 512 bytes exactly
    ("x" * MAX_EVENT_ID_BYTES, "x" * MAX_EVENT_ID_BYTES),
    ("x" * (MAX_EVENT_ID_BYTES + 1), None),
    ("é" * 257, None),  # 257 code points but 514 bytes
    ("😀" * 129, None),  # 129 code points, 516 bytes
    ("", None),
    (True, None),
    (1.5, None),
    (None, None),
    ({"a": 1}, None),
    (["a"], None),
])
def test_event_id_values_accepted_and_ignored(value, key) -> None:
    assert event_id(value) == key
    (row,) = _rows(Message.build("a-b", "logs", {"message": "m", "@metadata": {"_id": value, "protocol": "segment"}}))
    assert row["event_id"] == key
    assert row["protocol"] == "segment" and row["parse_error"] is None


def _rows(*msgs: Message, builder: BatchBuilder | None = None) -> list[dict]:
    b = builder or BatchBuilder()
    for m in msgs:
        b.add(m, NOW_US)
    return b.build().to_pylist()


def test_event_id_only_from_metadata_of_a_json_object() -> None:
    r = _rows(Message.build("a-b", "logs", {"_id": "top-level"}),
              Message.build("a-b", "logs", {"@metadata": "not an object"}),
              Message.build("a-b", "logs", b'[{"@metadata": {"_id": "in an array"}}]'),
              Message.build("a-b", "logs", b'{"@metadata": {"_id": "broken"'),
              Message.build("a-b", "logs", {"@metadata": {"_id": "zlib"}}, compression=Compression.ZLIB))
    assert [row["event_id"] for row in r] == [None, None, None, None, "zlib"]
    assert r[3]["parse_error"].startswith("bad_json")


def test_builder_drops_a_repeated_id_per_stream_and_keeps_bodies_without_one() -> None:
    b = BatchBuilder(dedupe=RecentKeys(100))
    keyed = {"message": "once", "@metadata": {"_id": "k1"}}
    plain = {"message": "every time"}
    results = [b.add(Message.build("a-prod", "logs", keyed, seq=1, device=1), NOW_US),
               b.add(Message.build("a-prod", "logs", keyed, seq=2, device=1), NOW_US),
               b.add(Message.build("b-prod", "logs", keyed, seq=3, device=1), NOW_US),  # another stream: its own row
               *(b.add(Message.build("a-prod", "logs", plain, seq=4 + i, device=1), NOW_US) for i in range(3)),
               b.add(Message.build("a-prod", "logs", {"@metadata": {"_id": 9}}, seq=7, device=1), NOW_US),
               b.add(Message.build("a-prod", "logs", {"@metadata": {"_id": "9"}}, seq=8, device=1), NOW_US)]
    assert results == [None, DUPLICATE_EVENT, None, None, None, None, None, DUPLICATE_EVENT]
    assert b.duplicates == 2 and b.parse_errors == 0
    rows = b.build().to_pylist()
    assert [(r["app_env"], r["seq"], r["event_id"]) for r in rows] == [
        ("a-prod", 1, "k1"), ("b-prod", 3, "k1"), ("a-prod", 4, None), ("a-prod", 5, None), ("a-prod", 6, None),
        ("a-prod", 7, "9")]
    assert stream_key("a-prod", "k1") in b.dedupe and stream_key("c-prod", "k1") not in b.dedupe


def test_without_a_dedupe_memory_every_copy_is_a_row() -> None:
    keyed = {"@metadata": {"_id": "k1"}}
    rows = _rows(*(Message.build("a-b", "logs", keyed, seq=i) for i in range(3)))
    assert [r["event_id"] for r in rows] == ["k1"] * 3


def test_importer_dedupe_flag_and_config_key(tmp_path) -> None:
    from importer.cli import build_parser, main
    from runtime.config import parse_args

    assert parse_args(build_parser(), []).dedupe_keys == DEFAULT_CAPACITY
    cfg = tmp_path / "importer.toml"
    cfg.write_text("dedupe-keys = 5000\n")
    assert parse_args(build_parser(), ["--config", str(cfg)]).dedupe_keys == 5000
    assert parse_args(build_parser(), ["--config", str(cfg), "--dedupe-keys", "0"]).dedupe_keys == 0
    with pytest.raises(SystemExit) as e:
        main(["--dedupe-keys", "-1"])
    assert e.value.code == 2
