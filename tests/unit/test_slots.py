"""Unit tests of the pure slot engine ``scheduling.slots``: cases, intervals, clocked, errors.

No database and no clock: periodic tasks are unsaved model instances (see ``slot_factories``).
DST tables are in ``test_slots_dst.py``, property tests in ``test_slots_properties.py``.
"""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django_celery_beat.models import (
    ClockedSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from scheduling import cron, slots
from scheduling.exceptions import ScheduleError
from tests.unit.slot_factories import (
    BERLIN,
    GRACE,
    NY,
    chain,
    clocked_task,
    cron_task,
    interval_task,
    next_id,
    take,
    utc,
)

# Building unsaved tasks ------------------------------------------------------------------------


def test_unsaved_tasks_carry_schedule_ids():
    assert interval_task(5).interval_id is not None
    cron = cron_task("4 16 * * *", NY)
    assert cron.crontab_id is not None
    assert cron.interval_id is None and cron.clocked_id is None
    assert str(cron.crontab.timezone) == NY


# Cases -----------------------------------------------------------------------------------------

MONDAY = utc(2025, 3, 3, 10, 0)  # a Monday


@pytest.mark.parametrize("day", range(1, 8))
def test_C02_weekly_interval_first_slot_survives_daily_restarts(day):
    task = interval_task(7, IntervalSchedule.DAYS, date_changed=MONDAY)
    restart = utc(2025, 3, 3, 9, 0) + timedelta(days=day)  # Tuesday 09:00 .. next Monday 09:00
    assert slots.initial_run(task, restart, last_slot=None, grace=GRACE) == utc(2025, 3, 10, 10, 0)


def test_C02_weekly_interval_chains_exactly_seven_days():
    task = interval_task(7, IntervalSchedule.DAYS, date_changed=MONDAY)
    assert take(task, utc(2025, 3, 4, 9, 0), 3) == [
        utc(2025, 3, 10, 10, 0),
        utc(2025, 3, 17, 10, 0),
        utc(2025, 3, 24, 10, 0),
    ]
    assert slots.next_run(task, utc(2025, 3, 10, 10, 0)) == utc(2025, 3, 17, 10, 0)


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        (utc(2025, 6, 2, 14, 5), (0, utc(2025, 6, 2, 15, 0))),
        (utc(2025, 6, 2, 14, 59, 59), (0, utc(2025, 6, 2, 15, 0))),
        (utc(2025, 6, 2, 15, 0), (1, utc(2025, 6, 2, 16, 0))),
        (utc(2025, 6, 2, 16, 0), (2, utc(2025, 6, 2, 17, 0))),
        (utc(2025, 6, 2, 16, 30), (2, utc(2025, 6, 2, 17, 0))),
    ],
)
def test_C04_hourly_crontab_slots_through(until, expected):
    task = cron_task("0 * * * *")
    assert slots.slots_through(task, utc(2025, 6, 2, 14, 0), until) == expected


def test_C04_pending_slot_after_last_one():
    task = cron_task("0 * * * *")
    assert slots.next_run(task, utc(2025, 6, 2, 13, 0)) == utc(2025, 6, 2, 14, 0)


def test_C05_new_york_spring_forward_day_afternoon():
    task = cron_task("4 16 * * *", NY)
    assert slots.next_run(task, utc(2025, 3, 9, 5, 0)) == utc(2025, 3, 9, 20, 4)


def test_C06_berlin_weekly_after_fall_back():
    task = cron_task("0 12 * * 1", BERLIN)
    first = slots.next_run(task, utc(2013, 10, 21, 10, 0))
    assert first == utc(2013, 10, 28, 11, 0)
    assert slots.next_run(task, first) == utc(2013, 11, 4, 11, 0)


@pytest.mark.parametrize("last_slot", [utc(2025, 6, 2, 9, 0), utc(2025, 6, 1, 9, 0), None])
@pytest.mark.parametrize("now", [utc(2025, 6, 3, 10, 0), utc(2025, 6, 3, 10, 0, 30)])
def test_C08_reenabled_daily_crontab_waits_for_next_day(last_slot, now):
    # Monday 2025-06-02; disabled Monday 08:00, re-enabled (edited) Tuesday 10:00.
    task = cron_task("0 9 * * *", date_changed=utc(2025, 6, 3, 10, 0))
    assert slots.initial_run(task, now, last_slot=last_slot, grace=GRACE) == utc(2025, 6, 4, 9, 0)


def test_C08_reenabled_just_after_a_slot_does_not_fire_at_once():
    # Re-enabled Tuesday 09:00:30, 30 s after the 09:00 slot (inside the 60 s grace).
    task = cron_task("0 9 * * *", date_changed=utc(2025, 6, 3, 9, 0, 30))
    now = utc(2025, 6, 3, 9, 0, 30)
    assert slots.initial_run(task, now, last_slot=utc(2025, 6, 2, 9, 0), grace=GRACE) == utc(
        2025, 6, 4, 9, 0
    )


def test_C08_reenabled_interval_with_past_start_time_does_not_fire_at_once():
    # Daily interval anchored at start_time Sunday 09:00; ran Monday 09:00; re-enabled Tuesday
    # 09:00:30, 30 s after Tuesday's slot (inside the 60 s grace).
    task = interval_task(
        1,
        IntervalSchedule.DAYS,
        start_time=utc(2025, 6, 1, 9, 0),
        date_changed=utc(2025, 6, 3, 9, 0, 30),
    )
    now = utc(2025, 6, 3, 9, 0, 30)
    last = utc(2025, 6, 2, 9, 0)
    assert slots.initial_run(task, now, last_slot=last, grace=GRACE) == utc(2025, 6, 4, 9, 0)
    # A new task saved just after its own start_time still has start_time as its first slot.
    fresh = interval_task(
        1,
        IntervalSchedule.DAYS,
        start_time=utc(2025, 6, 3, 9, 0),
        date_changed=utc(2025, 6, 3, 9, 0, 0, 300_000),
    )
    assert slots.initial_run(fresh, now, last_slot=None, grace=GRACE) == utc(2025, 6, 3, 9, 0)


def test_C10_start_time_before_first_crontab_slot():
    task = cron_task(
        "0 15 * * *", start_time=utc(2025, 6, 2, 14, 0), date_changed=utc(2025, 6, 1, 12, 0)
    )
    assert slots.initial_run(task, utc(2025, 6, 2, 14, 2), last_slot=None, grace=GRACE) == utc(
        2025, 6, 2, 15, 0
    )


@pytest.mark.parametrize(
    ("changed", "now"),
    [
        (timedelta(seconds=-2), timedelta(seconds=-1)),
        # saved a moment after its own start_time: start_time is still the first slot
        (timedelta(milliseconds=200), timedelta(milliseconds=500)),
    ],
    ids=["saved-before-start", "saved-just-after-start"],
)
def test_C11_interval_with_expires_gives_six_slots(changed, now):
    start = utc(2025, 6, 2, 12, 0, 0)
    task = interval_task(
        5,
        start_time=start,
        expires=start + timedelta(seconds=30),
        date_changed=start + changed,
    )
    first = slots.initial_run(task, start + now, last_slot=None, grace=GRACE)
    assert first == start
    found = [first]
    while (slot := slots.next_run(task, found[-1])) is not None:
        found.append(slot)
        assert len(found) <= 6
    assert found == [start + timedelta(seconds=s) for s in (0, 5, 10, 15, 20, 25)]
    assert slots.next_run(task, start + timedelta(seconds=25)) is None


def test_C12_start_time_tomorrow_waits_and_neighbour_runs_every_second():
    now = utc(2025, 6, 2, 12, 0, 0)
    tomorrow = utc(2025, 6, 3, 8, 0, 0)
    a = interval_task(1, start_time=tomorrow, date_changed=now - timedelta(minutes=5))
    b = interval_task(1, date_changed=now - timedelta(minutes=10))
    assert slots.initial_run(a, now, last_slot=None, grace=GRACE) == tomorrow
    first_b = slots.initial_run(b, now, last_slot=None, grace=GRACE)
    assert first_b == utc(2025, 6, 2, 11, 59, 1)  # oldest slot inside the 60 s grace
    assert take(b, first_b, 5) == [utc(2025, 6, 2, 11, 59, s) for s in range(2, 7)]


# Interval --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "after", "expected"),
    [
        # no start_time: anchored one interval after date_changed
        ({"date_changed": utc(2025, 1, 1, 0, 0, 0)}, utc(2024, 12, 31), utc(2025, 1, 1, 0, 0, 10)),
        (
            {"date_changed": utc(2025, 1, 1, 0, 0, 0)},
            utc(2025, 1, 1, 0, 0, 10),
            utc(2025, 1, 1, 0, 0, 20),
        ),
        (
            {"date_changed": utc(2025, 1, 1, 0, 0, 0)},
            utc(2025, 1, 1, 0, 0, 19, 999999),
            utc(2025, 1, 1, 0, 0, 20),
        ),
        (
            {"date_changed": utc(2025, 1, 1, 0, 0, 0)},
            utc(2025, 1, 1, 1, 0, 5),
            utc(2025, 1, 1, 1, 0, 10),
        ),
        # start_time is the anchor and the first slot, whatever date_changed says
        (
            {"date_changed": utc(2025, 1, 1), "start_time": utc(2025, 1, 2, 0, 0, 3)},
            utc(2025, 1, 1),
            utc(2025, 1, 2, 0, 0, 3),
        ),
        (
            {"date_changed": utc(2025, 1, 1), "start_time": utc(2025, 1, 2, 0, 0, 3)},
            utc(2025, 1, 2, 0, 0, 3),
            utc(2025, 1, 2, 0, 0, 13),
        ),
        # expires: no slot at or after it
        (
            {"date_changed": utc(2025, 1, 1), "expires": utc(2025, 1, 1, 0, 0, 20)},
            utc(2025, 1, 1, 0, 0, 10),
            None,
        ),
        (
            {"date_changed": utc(2025, 1, 1), "expires": utc(2025, 1, 1, 0, 0, 20, 1)},
            utc(2025, 1, 1, 0, 0, 10),
            utc(2025, 1, 1, 0, 0, 20),
        ),
    ],
)
def test_interval_next_run(fields, after, expected):
    assert slots.next_run(interval_task(10, **fields), after) == expected


def test_interval_in_other_zone_is_returned_in_utc():
    berlin = ZoneInfo(BERLIN)
    task = interval_task(
        1, IntervalSchedule.HOURS, start_time=datetime(2025, 6, 2, 12, 0, tzinfo=berlin)
    )
    slot = slots.next_run(task, utc(2025, 6, 2, 10, 30))
    assert slot == utc(2025, 6, 2, 11, 0)
    assert slot.tzinfo is UTC


@pytest.mark.parametrize(
    ("fields", "until", "expected"),
    [
        ({}, utc(2025, 1, 1, 0, 0, 5), (0, utc(2025, 1, 1, 0, 0, 10))),
        ({}, utc(2024, 12, 31, 23, 59, 55), (0, utc(2025, 1, 1, 0, 0, 10))),
        ({}, utc(2025, 1, 1, 0, 0, 20), (2, utc(2025, 1, 1, 0, 0, 30))),
        ({}, utc(2025, 1, 1, 0, 0, 25), (2, utc(2025, 1, 1, 0, 0, 30))),
        ({}, utc(2025, 1, 1, 1, 0, 0), (360, utc(2025, 1, 1, 1, 0, 10))),
        ({"expires": utc(2025, 1, 1, 0, 0, 30)}, utc(2025, 1, 1, 0, 0, 25), (2, None)),
        ({"expires": utc(2025, 1, 1, 0, 0, 15)}, utc(2025, 1, 1, 0, 0, 40), (1, None)),
        ({"expires": utc(2025, 1, 1, 0, 0, 20)}, utc(2025, 1, 1, 0, 0, 40), (1, None)),
        ({"expires": utc(2025, 1, 1, 0, 0, 20, 1)}, utc(2025, 1, 1, 0, 0, 40), (2, None)),
        ({"expires": utc(2025, 1, 1, 0, 0, 5)}, utc(2025, 1, 1, 0, 0, 40), (0, None)),
    ],
)
def test_interval_slots_through(fields, until, expected):
    # Slot 2025-01-01 00:00:00 of an every-10-s task; expired slots are never counted.
    task = interval_task(10, start_time=utc(2025, 1, 1), **fields)
    assert slots.slots_through(task, utc(2025, 1, 1), until) == expected


def test_crontab_slots_through_caps_the_count():
    # 8 days of a per-minute crontab is 11,520 slots; the count stops at MAX_COUNTED_SLOTS and
    # the next slot is still the first one after `until`.
    task = cron_task("* * * * *")
    slot = utc(2025, 6, 2, 0, 0)
    until = utc(2025, 6, 10, 0, 0, 30)
    assert slots.MAX_COUNTED_SLOTS == 10_000
    assert slots.slots_through(task, slot, until) == (10_000, utc(2025, 6, 10, 0, 1))


def test_crontab_slots_through_stops_at_expires():
    task = cron_task("0 * * * *", expires=utc(2025, 6, 2, 16, 0))
    assert slots.slots_through(task, utc(2025, 6, 2, 14, 0), utc(2025, 6, 2, 16, 30)) == (1, None)


# Clocked ---------------------------------------------------------------------------------------

CLOCKED_AT = utc(2025, 6, 2, 9, 30)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (utc(2025, 6, 2, 9, 0), CLOCKED_AT),
        (CLOCKED_AT - timedelta(microseconds=1), CLOCKED_AT),
        (CLOCKED_AT, None),
        (utc(2025, 6, 2, 12, 0), None),
    ],
)
def test_clocked_next_run(after, expected):
    task = clocked_task(ClockedSchedule(id=next_id(), clocked_time=CLOCKED_AT))
    assert slots.next_run(task, after) == expected


def test_clocked_time_in_other_zone_is_returned_in_utc():
    at = datetime(2025, 6, 2, 11, 30, tzinfo=ZoneInfo(BERLIN))
    task = clocked_task(ClockedSchedule(id=next_id(), clocked_time=at))
    slot = slots.next_run(task, utc(2025, 6, 2))
    assert slot == CLOCKED_AT
    assert slot.tzinfo is UTC


def test_C07_two_tasks_sharing_one_clocked_row_get_the_same_slot():
    clocked = ClockedSchedule(id=next_id(), clocked_time=CLOCKED_AT)
    a, b = clocked_task(clocked), clocked_task(clocked)
    now = utc(2025, 6, 2, 9, 0)
    assert slots.initial_run(a, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.initial_run(b, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.task_id_for(1, CLOCKED_AT) != slots.task_id_for(2, CLOCKED_AT)


def test_clocked_initial_run_plans_a_past_time_once():
    task = clocked_task(
        ClockedSchedule(id=next_id(), clocked_time=CLOCKED_AT), date_changed=utc(2025, 6, 1)
    )
    now = utc(2025, 6, 2, 12, 0)  # 2.5 h late, far past the grace
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.initial_run(task, now, last_slot=CLOCKED_AT, grace=GRACE) is None


def test_one_off_interval_task_with_a_run_plans_nothing():
    task = interval_task(10, one_off=True, date_changed=utc(2025, 6, 2))
    now = utc(2025, 6, 2, 0, 5)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 0, 4, 10)
    assert slots.initial_run(task, now, last_slot=utc(2025, 6, 2, 0, 0, 10), grace=GRACE) is None


def test_re_armed_one_off_runs_again():
    """A one-off edited after its run (re-armed) plans again; a new clocked time is a new slot."""
    ran_at = utc(2025, 6, 2, 0, 0, 10)
    task = interval_task(10, one_off=True, date_changed=utc(2025, 6, 2, 0, 3))
    now = utc(2025, 6, 2, 0, 3, 1)
    assert slots.initial_run(task, now, last_slot=ran_at, grace=GRACE) == utc(2025, 6, 2, 0, 3, 10)

    later = CLOCKED_AT + timedelta(days=1)
    moved = clocked_task(
        ClockedSchedule(id=next_id(), clocked_time=later), date_changed=CLOCKED_AT
    )
    assert slots.initial_run(moved, now, last_slot=CLOCKED_AT, grace=GRACE) == later


# initial_run floors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_slot", "last_run_at", "expected"),
    [
        (None, None, utc(2025, 6, 2, 11, 59, 10)),  # oldest slot within grace of now
        (utc(2025, 6, 2, 11, 59, 30), None, utc(2025, 6, 2, 11, 59, 40)),  # never at/before last
        (None, utc(2025, 6, 2, 11, 59, 50), utc(2025, 6, 2, 12, 0, 0)),
        (utc(2025, 6, 2, 12, 0, 30), None, utc(2025, 6, 2, 12, 0, 40)),  # planned ahead of now
    ],
)
def test_initial_run_floors(last_slot, last_run_at, expected):
    task = interval_task(10, date_changed=utc(2025, 6, 2, 0, 0), last_run_at=last_run_at)
    now = utc(2025, 6, 2, 12, 0, 5)
    assert slots.initial_run(task, now, last_slot=last_slot, grace=GRACE) == expected


def test_initial_run_never_before_date_changed():
    # Edited 11:30:07 (after the grace floor): first slot one interval after the edit.
    task = interval_task(10, date_changed=utc(2025, 6, 2, 11, 59, 37))
    now = utc(2025, 6, 2, 12, 0, 5)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 11, 59, 47)
    # Edited 12:00:10: the 12:00 slot is inside the grace of now (12:00:50) but before the edit.
    cron = cron_task("* * * * *", date_changed=utc(2025, 6, 2, 12, 0, 10))
    now = utc(2025, 6, 2, 12, 0, 50)
    assert slots.initial_run(cron, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 12, 1)


# Crontab basics --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("* * * * *", utc(2025, 6, 2, 12, 0, 0), utc(2025, 6, 2, 12, 1)),
        ("* * * * *", utc(2025, 6, 2, 12, 0, 59, 999999), utc(2025, 6, 2, 12, 1)),
        ("0 0 1 1 *", utc(2025, 6, 2), utc(2026, 1, 1)),
        ("0 0 29 2 *", utc(2025, 3, 1), utc(2028, 2, 29)),
        # day of month AND day of week (Celery's rule): Friday the 13th
        ("0 0 13 * 5", utc(2025, 1, 1), utc(2025, 6, 13)),
        ("0 0 13 * 5", utc(2025, 6, 13), utc(2026, 2, 13)),
        ("*/15 9-10 * * 1-5", utc(2025, 6, 6, 10, 45), utc(2025, 6, 9, 9, 0)),  # Fri -> Mon
    ],
)
def test_crontab_next_run_utc(expr, after, expected):
    slot = slots.next_run(cron_task(expr), after)
    assert slot == expected
    assert slot.tzinfo is UTC


def test_crontab_start_time_and_expires():
    task = cron_task("0 * * * *", start_time=utc(2025, 6, 2, 14, 0), expires=utc(2025, 6, 2, 17, 0))
    assert slots.next_run(task, utc(2025, 6, 1)) == utc(2025, 6, 2, 14, 0)
    assert chain(task, utc(2025, 6, 1), utc(2025, 6, 3)) == [
        utc(2025, 6, 2, 14),
        utc(2025, 6, 2, 15),
        utc(2025, 6, 2, 16),
    ]


# task_id_for -----------------------------------------------------------------------------------


def test_task_id_for_is_a_deterministic_uuid():
    slot = utc(2025, 6, 2, 14, 0)
    first = slots.task_id_for(42, slot)
    assert first == slots.task_id_for(42, slot)
    assert str(uuid.UUID(first)) == first
    assert uuid.UUID(first).version == 5
    # The same instant written in another zone is the same run.
    assert slots.task_id_for(42, slot.astimezone(ZoneInfo(BERLIN))) == first
    assert slots.task_id_for(43, slot) != first
    assert slots.task_id_for(42, slot + timedelta(microseconds=1)) != first
    assert slots.task_id_for(42, slot + timedelta(hours=1)) != first


def test_task_id_for_is_stable_across_releases():
    # Pinned: replicas on two releases must derive the same id for the same run (invariant 2).
    assert slots.task_id_for(1, utc(2025, 1, 1)) == str(
        uuid.uuid5(
            uuid.UUID("6f1c8a52-5d7e-4b7a-9a51-3c1f1e0b7d21"), "1@2025-01-01T00:00:00.000000+00:00"
        )
    )


# Errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("every", "period"), [(0, "seconds"), (-5, "minutes"), (1, "fortnights")])
def test_bad_interval_raises_schedule_error(every, period):
    task = interval_task(every, period, date_changed=utc(2025, 1, 1))
    with pytest.raises(ScheduleError):
        slots.next_run(task, utc(2025, 1, 1))


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30,31 2 *", "0 0 31 4,6,9,11 *"])
def test_crontab_that_never_matches_raises_schedule_error(expr):
    _, _, day, month, _ = expr.split()
    with pytest.raises(ScheduleError) as caught:
        slots.next_run(cron_task(expr), utc(2025, 1, 1))
    assert str(caught.value) == (  # the same words on every Celery version (5.7 checks it too)
        f"invalid crontab {expr}: day_of_month {day!r} never occurs in month_of_year {month!r}"
    )


def test_crontab_search_gives_up_after_max_search_days(monkeypatch):
    monkeypatch.setattr(slots, "MAX_SEARCH_DAYS", 200)
    with pytest.raises(ScheduleError, match="matches no day within 200 days"):
        slots.next_run(cron_task("0 0 1 1 *"), utc(2025, 6, 1))


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (utc(2072, 2, 29, 0, 0), utc(2112, 2, 29)),  # 2100 is not a leap year: 40 years apart
        (utc(2068, 1, 1), utc(2072, 2, 29)),
        (utc(2025, 6, 1), utc(2044, 2, 29)),  # the one after is 2072: 47 years from `after`
    ],
)
def test_leap_day_on_a_weekday_is_found_decades_ahead(after, expected):
    assert slots.next_run(cron_task("0 0 29 2 1"), after) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "61 * * * *",
        "0 24 * * *",
        "0 0 32 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "*/0 * * * *",
        "x * * * *",
    ],
)
def test_invalid_crontab_field_raises_schedule_error(expr):
    with pytest.raises(ScheduleError, match="invalid crontab"):
        slots.next_run(cron_task(expr), utc(2025, 1, 1))


def test_one_crontab_is_expanded_once_and_a_refused_one_every_time(monkeypatch):
    expanded = []
    parse = cron.CronSpec.parse

    def counting(*fields):
        expanded.append(fields)
        return parse(*fields)

    monkeypatch.setattr(cron.CronSpec, "parse", counting)
    cron.spec_for.cache_clear()
    try:
        first = slots.next_run(cron_task("7 3 * * 1-5"), utc(2025, 6, 2))
        again = slots.next_run(cron_task("7 3 * * 1-5"), utc(2025, 6, 3))
        for _ in range(2):
            with pytest.raises(ScheduleError, match="invalid crontab 61 3"):
                slots.next_run(cron_task("61 3 * * *"), utc(2025, 1, 1))
    finally:
        cron.spec_for.cache_clear()
    assert (first, again) == (utc(2025, 6, 2, 3, 7), utc(2025, 6, 3, 3, 7))
    assert expanded == [("7", "3", "*", "*", "1-5"), ("61", "3", "*", "*", "*"),
                        ("61", "3", "*", "*", "*")]


def test_tasks_sharing_a_crontab_at_one_slot_walk_it_once():
    cron.next_cron_instant.cache_clear()
    paris = ZoneInfo("Europe/Paris")
    try:
        # 100 tasks (each its own crontab row, the same fields) due at one slot: one walk.
        nexts = {slots.next_run(cron_task("30 2 * * *", tz="Europe/Paris"), utc(2026, 3, 28, 1, 30))
                 for _ in range(100)}
        shared = cron.next_cron_instant.cache_info()
        # The same instant written in another zone is the same key, and the same answer.
        again = slots.next_run(
            cron_task("30 2 * * *", tz="Europe/Paris"),
            datetime(2026, 3, 28, 2, 30, tzinfo=paris),
        )
        # A refused search keeps nothing: it walks every time.
        for _ in range(2):
            with pytest.raises(ScheduleError, match="matches no day"):
                cron.next_cron_instant(cron.spec_for("0", "0", "1", "1", "*"), paris,
                                       utc(2026, 1, 2), 10)
        after = cron.next_cron_instant.cache_info()
    finally:
        cron.next_cron_instant.cache_clear()
    # 02:30 does not exist in Paris on 29 March 2026: the fixed-time job runs at the jump.
    assert nexts == {utc(2026, 3, 29, 1, 0)} and again == utc(2026, 3, 29, 1, 0)
    assert (shared.misses, shared.hits, shared.currsize) == (1, 99, 1)
    assert (after.misses, after.hits, after.currsize) == (3, 100, 1)
    assert cron.next_cron_instant.__wrapped__(
        cron.spec_for("30", "2", "*", "*", "*"), paris, utc(2026, 3, 28, 1, 30)
    ) == utc(2026, 3, 29, 1, 0)


def solar_task(event: str, latitude: float, longitude: float) -> PeriodicTask:
    solar = SolarSchedule(id=next_id(), event=event, latitude=latitude, longitude=longitude)
    return PeriodicTask(name="solar", task="project.tasks.record", solar=solar)


def test_solar_without_ephem_raises_schedule_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ephem", None)  # what `import ephem` sees when not installed
    with pytest.raises(ScheduleError, match="pip install ephem"):
        slots.next_run(solar_task("sunrise", 52.52, 13.40), utc(2025, 1, 1))


# Berlin (52.52 N, 13.40 E), published almanac times in CEST (UTC+2), to the minute.
@pytest.mark.parametrize(
    ("event", "after", "expected"),
    [
        ("sunrise", utc(2026, 6, 21), utc(2026, 6, 21, 2, 43)),  # 04:43 CEST
        ("sunset", utc(2026, 6, 21), utc(2026, 6, 21, 19, 33)),  # 21:33 CEST
        ("sunrise", utc(2026, 6, 21, 3), utc(2026, 6, 22, 2, 43)),  # after today's: tomorrow's
    ],
)
def test_solar_slots_are_the_event_times(event, after, expected):
    slot = slots.next_run(solar_task(event, 52.52, 13.40), after)
    assert abs(slot - expected) < timedelta(minutes=1), slot
    assert (slot.tzinfo, slot.microsecond) == (UTC, 0)
    # the same slot from any moment before the event (float noise does not move it)
    assert slots.next_run(solar_task(event, 52.52, 13.40), after + timedelta(seconds=7)) == slot


def test_solar_slot_chain_is_one_per_day_and_strictly_after():
    task = solar_task("sunrise", 52.52, 13.40)
    chain = [utc(2026, 3, 20)]
    for _ in range(5):
        chain.append(slots.next_run(task, chain[-1]))
    assert [s.microsecond for s in chain] == [0] * 6
    # from the slot just dispatched, rounded up or down, the next slot is the next day's event
    gaps = [b - a for a, b in zip(chain[1:], chain[2:])]
    # around the March equinox, sunrise in Berlin comes about 3.7 minutes earlier each day
    assert all(timedelta(hours=23, minutes=54) < g < timedelta(hours=23, minutes=58) for g in gaps)


def test_task_without_schedule_raises_schedule_error():
    task = PeriodicTask(name="none", task="project.tasks.record")
    with pytest.raises(ScheduleError, match="no schedule"):
        slots.next_run(task, utc(2025, 1, 1))


@pytest.mark.parametrize(
    "task",
    [interval_task(5, date_changed=utc(2025, 1, 1)), cron_task("0 * * * *")],
    ids=["interval", "crontab"],
)
def test_naive_after_raises_value_error(task):
    with pytest.raises(ValueError, match="aware"):
        slots.next_run(task, datetime(2025, 1, 1, 12, 0))


def test_a_huge_interval_is_a_schedule_error_not_an_overflow():
    task = interval_task(3_000_000, IntervalSchedule.DAYS, date_changed=utc(2025, 6, 2))
    with pytest.raises(ScheduleError, match="out of range"):
        slots.next_run(task, utc(2025, 6, 2, 1))


def test_coalesced_interval_count_is_capped_but_the_next_slot_exact():
    """A run from 1900 of a 1 s interval stands for at most MAX_COUNTED_SLOTS slots."""
    task = interval_task(1, start_time=utc(1900, 1, 1), date_changed=utc(1900, 1, 1))
    count, following = slots.slots_through(task, utc(1900, 1, 1), utc(2025, 6, 2, 12, 0, 0, 500))
    assert (count, following) == (slots.MAX_COUNTED_SLOTS, utc(2025, 6, 2, 12, 0, 1))
