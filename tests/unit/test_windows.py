"""The schedule health page's windows and the stacking of a chart column (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling.timeline import stack
from scheduling.windows import custom, duration_label, preset, step_for

NOW = datetime(2026, 12, 1, 12, 38, 23, 500000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("key", "origin", "step", "buckets"),
    [
        ("1h", datetime(2026, 12, 1, 11, 39, tzinfo=UTC), 60, 60),
        ("24h", datetime(2026, 11, 30, 12, 45, tzinfo=UTC), 900, 96),
        ("7d", datetime(2026, 11, 24, 14, 0, tzinfo=UTC), 7200, 84),
    ],
)
def test_a_preset_ends_with_the_bucket_holding_now(key, origin, step, buckets):
    window = preset(key, NOW)
    assert (window.origin, window.start, window.end) == (origin, origin, NOW)
    assert (window.step.total_seconds(), window.buckets) == (step, buckets)
    assert window.bucket_of(NOW) == buckets - 1
    assert window.bucket_of(origin) == 0 and window.bucket_of(origin - timedelta(microseconds=1)) == -1


def test_now_on_a_boundary_starts_the_last_bucket():
    on_the_hour = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    window = preset("1h", on_the_hour)
    assert window.origin == datetime(2026, 12, 1, 11, 1, tzinfo=UTC)
    assert window.bucket_of(on_the_hour) == 59


def test_a_preset_in_another_time_zone_is_the_same_window():
    berlin = NOW.astimezone(ZoneInfo("Europe/Berlin"))
    assert preset("24h", berlin) == preset("24h", NOW)


def test_a_custom_range_is_covered_by_aligned_buckets():
    window = custom(datetime(2026, 1, 5, 10, 7, tzinfo=UTC), datetime(2026, 1, 5, 13, 7, tzinfo=UTC))
    assert window.step == timedelta(minutes=2)
    assert window.origin == datetime(2026, 1, 5, 10, 6, tzinfo=UTC)
    assert window.buckets == 91  # 10:06 to 13:08
    assert window.label == "2026-01-05 10:07 to 2026-01-05 13:07 UTC"
    with pytest.raises(ValueError, match="ends"):
        custom(window.end, window.start)


@pytest.mark.parametrize(
    ("span", "step"),
    [(timedelta(minutes=30), 60), (timedelta(hours=2), 60), (timedelta(hours=2, minutes=1), 120),
     (timedelta(days=30), 6 * 3600), (timedelta(days=120), 86400),
     (timedelta(days=3000), 28 * 86400), (timedelta(days=20 * 365), 61 * 86400)],
)
def test_step_keeps_to_120_buckets(span, step):
    assert step_for(span).total_seconds() == step
    assert span / step_for(span) <= 120


def test_ticks_are_bucket_boundaries_at_most_eight():
    day = preset("24h", NOW)
    ticks = day.ticks()
    assert [f"{t:%H:%M}" for _i, t in ticks] == [
        "15:00", "18:00", "21:00", "00:00", "03:00", "06:00", "09:00", "12:00"
    ]
    assert [i for i, _t in ticks] == [9, 21, 33, 45, 57, 69, 81, 93]
    week = preset("7d", NOW)
    assert [f"{t:%d %H}" for _i, t in week.ticks()] == [
        "25 00", "26 00", "27 00", "28 00", "29 00", "30 00", "01 00"
    ]
    assert [f"{t:%H:%M}" for _i, t in preset("1h", NOW).ticks()] == [
        "11:40", "11:50", "12:00", "12:10", "12:20", "12:30"
    ]


def test_duration_labels():
    assert [duration_label(timedelta(minutes=m)) for m in (1, 15, 120, 1440, 2880)] == [
        "1 minute", "15 minutes", "2 hours", "1 day", "2 days"
    ]


def test_stack_keeps_every_outcome_visible_and_the_majority_largest():
    heights = stack([95, 1], 20)
    assert heights == [3 + 14 * 95 / 96, 3 + 14 / 96]
    assert sum(heights) == pytest.approx(20)
    assert stack([1], 20) == [20]
    assert stack([], 20) == []
    assert stack([5, 1, 1, 1], 10) == [2.5, 2.5, 2.5, 2.5]  # minimums do not fit: equal shares
    shares = stack([1, 2, 3], 20)
    assert shares == sorted(shares) and min(shares) > 3
