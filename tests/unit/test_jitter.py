"""Stable jitter: offsets from (periodic task id, slot) only, spread evenly, never past the next
slot."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling import slots
from tests.unit.slot_factories import cron_task, interval_task, take, utc

MINUTE = timedelta(seconds=60)


def test_the_offset_depends_on_the_task_and_the_slot_only():
    slot = utc(2026, 12, 1, 14, 0)
    first = slots.jitter_offset(7, slot, MINUTE)
    assert first == slots.jitter_offset(7, slot, MINUTE)  # any replica, any time
    assert first == slots.jitter_offset(7, slot.astimezone(ZoneInfo("Europe/Berlin")), MINUTE)
    assert first != slots.jitter_offset(8, slot, MINUTE)
    assert first != slots.jitter_offset(7, slot + timedelta(hours=1), MINUTE)
    assert timedelta(0) <= first < MINUTE
    assert first.microseconds != 0 or first.seconds != 0  # to the microsecond, not whole seconds


def test_offsets_of_10000_slots_of_one_task_are_spread_evenly():
    task_slots = [utc(2026, 1, 1) + k * timedelta(hours=1) for k in range(10_000)]
    offsets = [slots.jitter_offset(42, slot, MINUTE) for slot in task_slots]
    assert min(offsets) >= timedelta(0) and max(offsets) < MINUTE
    per_tenth = Counter(int(o / (MINUTE / 10)) for o in offsets)
    assert sorted(per_tenth) == list(range(10))
    # 1,000 expected in each tenth of the minute; a uniform spread stays within +-10 %
    assert all(900 <= n <= 1100 for n in per_tenth.values()), per_tenth
    per_second = Counter(int(o.total_seconds()) for o in offsets)
    assert len(per_second) == 60 and max(per_second.values()) <= 10_000 * 0.025


def test_1000_tasks_sharing_a_slot_land_evenly_across_the_minute():
    slot = utc(2026, 12, 1, 15, 0)
    offsets = [slots.jitter_offset(task_id, slot, MINUTE) for task_id in range(501, 1501)]
    per_second = Counter(int(o.total_seconds()) for o in offsets)
    # consecutive ids follow the golden-ratio sequence: 16 or 17 tasks in every second
    assert sorted(per_second) == list(range(60))
    assert set(per_second.values()) <= {16, 17, 18}, per_second


def test_the_due_moment_is_capped_at_the_gap_to_the_next_slot():
    every_10 = interval_task(10, start_time=utc(2026, 1, 1), pk=3)
    for slot in take(every_10, utc(2026, 1, 1), 2000):
        due = slots.due_moment(every_10, slot, 3600)
        assert slot <= due < slot + timedelta(seconds=10)
    assert slots.due_moment(every_10, utc(2026, 1, 1), 0) == utc(2026, 1, 1)

    hourly = cron_task("0 * * * *", pk=4)
    dues = [slots.due_moment(hourly, slot, 60) for slot in take(hourly, utc(2026, 1, 1), 500)]
    assert all(timedelta(0) <= due - due.replace(minute=0, second=0, microsecond=0) < MINUTE
               for due in dues)
    # a jitter longer than the gap (an hour) is capped at it: never past the next slot
    capped = [slots.due_moment(hourly, slot, 7200) for slot in take(hourly, utc(2026, 1, 1), 500)]
    assert all(due.minute < 60 and due.hour == slot.hour for due, slot in
               zip(capped, take(hourly, utc(2026, 1, 1), 500), strict=True))
    assert max(d.minute for d in capped) >= 55  # the whole hour is used


@pytest.mark.parametrize("jitter", [timedelta(0), timedelta(microseconds=-5)])
def test_no_jitter_no_offset(jitter):
    assert slots.jitter_offset(1, utc(2026, 1, 1), jitter) == timedelta(0)
