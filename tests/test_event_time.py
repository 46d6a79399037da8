"""The event-time window (table/event_time.py): which day a row is filed under, and the mark.

Pure: Arrow columns in, Arrow columns out, checked against the rule written once per row in
Python, at the window's edges and for arbitrary times (Hypothesis).
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from importer.decode import MAX_CREATED_MS, BatchBuilder
from table.event_time import DAY_US, EventWindow, moved_by_stream
from table.schema import ARROW_SCHEMA

NOW_US = 1_764_201_600_000_000 + 12 * 3600 * 10**6 + 123  # 2025-11-27 12:00 UTC
TODAY = datetime.date(2025, 11, 27)
EPOCH = datetime.date(1970, 1, 1)


def expected(window: EventWindow, created: int, ingested: int) -> tuple[datetime.date, bool | None]:
    """The rule, one row at a time."""
    lag = ingested - created
    inside = lag >= -window.max_days_hence * DAY_US and (window.max_days_ago is None
                                                         or lag <= window.max_days_ago * DAY_US)
    chosen = created if inside else ingested
    return EPOCH + datetime.timedelta(days=chosen // DAY_US), None if inside else True


def dates(window: EventWindow, created: list[int], ingested: list[int]) -> list[tuple[datetime.date, bool | None]]:
    date, mark = window.dates(pa.array(created, pa.int64()), pa.array(ingested, pa.int64()))
    assert date.type == pa.date32() and mark.type == pa.bool_()
    return list(zip(date.to_pylist(), mark.to_pylist()))


def test_edges_of_a_seven_day_window() -> None:
    w = EventWindow(7)
    day = DAY_US
    cases = {
        NOW_US: (TODAY, None),
        NOW_US - 7 * day: (TODAY - datetime.timedelta(days=7), None),  # exactly the retention: its own day
        NOW_US - 7 * day - 1: (TODAY, True),
        NOW_US - 3 * day: (TODAY - datetime.timedelta(days=3), None),
        NOW_US + day: (TODAY + datetime.timedelta(days=1), None),  # exactly a day ahead: its own day
        NOW_US + day + 1: (TODAY, True),
        NOW_US + 400 * day: (TODAY, True),
        1000: (TODAY, True),  # 1970
        MAX_CREATED_MS * 1000: (TODAY, True),  # 9999-12-31
    }
    got = dates(w, list(cases), [NOW_US] * len(cases))
    assert got == list(cases.values())


def test_without_retention_only_the_future_is_bounded() -> None:
    w = EventWindow.for_retention(0)
    assert w.max_days_ago is None
    assert dates(w, [1000, NOW_US + 2 * DAY_US], [NOW_US, NOW_US]) == [(EPOCH, None), (TODAY, True)]


def test_all_inside_gives_an_all_null_mark() -> None:
    date, mark = EventWindow(7).dates(pa.array([NOW_US] * 5, pa.int64()), pa.array([NOW_US] * 5, pa.int64()))
    assert mark.null_count == 5
    assert EventWindow(7).dates(pa.array([], pa.int64()), pa.array([], pa.int64()))[0].to_pylist() == []


@given(st.lists(st.tuples(st.integers(0, MAX_CREATED_MS * 1000), st.integers(0, MAX_CREATED_MS * 1000)),
                max_size=50),
       st.one_of(st.none(), st.integers(1, 3650)), st.integers(0, 30))
def test_vectorised_rule_equals_the_rule_row_by_row(rows: list[tuple[int, int]], ago: int | None, hence: int) -> None:
    w = EventWindow(ago, hence)
    created, ingested = [c for c, _ in rows], [i for _, i in rows]
    assert dates(w, created, ingested) == [expected(w, c, i) for c, i in rows]


def test_moved_rows_are_counted_by_stream_with_their_time_range() -> None:
    app_envs = pa.array(["a-prod", "b-prod", "a-prod", "c-prod"])
    created = pa.array([5, 1, 9, 3], pa.int64())
    mark = pa.array([True, None, True, None], pa.bool_())
    assert moved_by_stream(app_envs, created, mark) == {"a-prod": (2, 5, 9)}
    assert moved_by_stream(app_envs, created, pa.nulls(4, pa.bool_())) == {}


def test_the_builder_files_rows_out_of_the_window_under_their_arrival_day_and_keeps_their_time() -> None:
    b = BatchBuilder(window=EventWindow(7))
    times = [NOW_US // 1000 - 10 * 86_400_000, NOW_US // 1000 - 86_400_000, NOW_US // 1000 + 400 * 86_400_000]
    for seq, created_ms in enumerate(times, 1):
        b.add_raw("late-prod", "logs", b'{"message":"m"}', 0, 1, created_ms, seq, NOW_US)
    b.add_raw("ok-prod", "logs", b'{"message":"m"}', 0, 1, NOW_US // 1000, 9, NOW_US)
    table = b.build()
    assert table.schema == ARROW_SCHEMA
    rows = table.to_pylist()
    assert [r["date"] for r in rows] == [TODAY, TODAY - datetime.timedelta(days=1), TODAY, TODAY]
    assert [r["created_out_of_window"] for r in rows] == [True, None, True, None]
    assert [r["created_at"].timestamp() * 1000 for r in rows[:3]] == pytest.approx(times)
    moved = b.take_out_of_window()
    assert moved == {"late-prod": (2, times[0] * 1000, times[2] * 1000)}
    assert b.take_out_of_window() == {}
