"""Unit tests of the pure slot engine ``scheduling.slots`` (no database, no clock).

Periodic tasks are unsaved model instances. ``slots`` looks at ``task.interval_id`` and friends,
so each related schedule gets a fake primary key before it is assigned.

Expected instants are worked out by hand from each zone's rules (2025 unless said otherwise):
- America/New_York: EST -05:00 / EDT -04:00. Spring forward 2025-03-09 02:00 EST = 07:00 UTC
  (02:00-02:59 local is skipped); fall back 2025-11-02 02:00 EDT = 06:00 UTC (01:00-01:59 local
  happens twice: 05:xx UTC as EDT, 06:xx UTC as EST).
- Europe/Berlin: CET +01:00 / CEST +02:00. Spring forward 2025-03-30 01:00 UTC (02:xx local
  skipped); fall back 2025-10-26 01:00 UTC (02:xx local twice: 00:xx UTC, then 01:xx UTC).
- Australia/Sydney: AEST +10:00 / AEDT +11:00. Fall back 2025-04-06 03:00 AEDT = 2025-04-05
  16:00 UTC (02:xx local twice: 15:xx UTC, then 16:xx UTC); spring forward 2025-10-05 02:00 AEST
  = 2025-10-04 16:00 UTC (02:xx local skipped).
- Asia/Kolkata: IST +05:30 all year, no DST.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from celery import schedules
from croniter import croniter
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduling import slots
from scheduling.exceptions import ScheduleError

NY = "America/New_York"
BERLIN = "Europe/Berlin"
SYDNEY = "Australia/Sydney"
KOLKATA = "Asia/Kolkata"

GRACE = timedelta(seconds=60)
_ids = itertools.count(1)


def utc(*args: int) -> datetime:
    """Return an aware UTC datetime: utc(2025, 3, 9, 20, 4)."""
    return datetime(*args, tzinfo=UTC)


def interval_task(every: int, period: str = IntervalSchedule.SECONDS, **fields) -> PeriodicTask:
    """Return an unsaved interval task (the schedule gets a fake id so ``interval_id`` is set)."""
    n = next(_ids)
    schedule = IntervalSchedule(id=n, every=every, period=period)
    return PeriodicTask(name=f"interval-{n}", task="project.tasks.record", interval=schedule, **fields)


def cron_task(expr: str, tz: str = "UTC", **fields) -> PeriodicTask:
    """Return an unsaved crontab task for a five-field expression evaluated in zone ``tz``."""
    n = next(_ids)
    minute, hour, day_of_month, month_of_year, day_of_week = expr.split()
    schedule = CrontabSchedule(
        id=n,
        minute=minute,
        hour=hour,
        day_of_month=day_of_month,
        month_of_year=month_of_year,
        day_of_week=day_of_week,
        timezone=tz,
    )
    return PeriodicTask(name=f"cron-{n}", task="project.tasks.record", crontab=schedule, **fields)


def clocked_task(clocked: ClockedSchedule, **fields) -> PeriodicTask:
    """Return an unsaved one-off task on ``clocked`` (django-celery-beat requires one_off)."""
    fields.setdefault("one_off", True)
    n = next(_ids)
    return PeriodicTask(name=f"clocked-{n}", task="project.tasks.record", clocked=clocked, **fields)


def chain(task: PeriodicTask, after: datetime, before: datetime) -> list[datetime]:
    """Return every slot of ``task`` in ``(after, before)`` by chaining ``next_run``."""
    found: list[datetime] = []
    slot = slots.next_run(task, after)
    while slot is not None and slot < before:
        found.append(slot)
        slot = slots.next_run(task, slot)
    return found


def take(task: PeriodicTask, after: datetime, n: int) -> list[datetime]:
    """Return the first ``n`` slots of ``task`` after ``after`` (fewer if the schedule ends)."""
    found: list[datetime] = []
    slot = slots.next_run(task, after)
    while slot is not None and len(found) < n:
        found.append(slot)
        slot = slots.next_run(task, slot)
    return found


def local_day_bounds(day: date, tz: str) -> tuple[datetime, datetime]:
    """Return the UTC instants of local midnight starting ``day`` and the next day."""
    zone = ZoneInfo(tz)
    start = datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone).astimezone(UTC)
    return start, end


def every(first: datetime, step: timedelta, count: int) -> list[datetime]:
    return [first + k * step for k in range(count)]


# Building unsaved tasks ------------------------------------------------------------------------


def test_unsaved_tasks_carry_schedule_ids():
    assert interval_task(5).interval_id is not None
    cron = cron_task("4 16 * * *", NY)
    assert (cron.crontab_id, cron.interval_id, cron.clocked_id) != (None, None, None)
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
        ({"date_changed": utc(2025, 1, 1, 0, 0, 0)}, utc(2025, 1, 1, 0, 0, 10), utc(2025, 1, 1, 0, 0, 20)),
        ({"date_changed": utc(2025, 1, 1, 0, 0, 0)}, utc(2025, 1, 1, 0, 0, 19, 999999), utc(2025, 1, 1, 0, 0, 20)),
        ({"date_changed": utc(2025, 1, 1, 0, 0, 0)}, utc(2025, 1, 1, 1, 0, 5), utc(2025, 1, 1, 1, 0, 10)),
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
    task = interval_task(1, IntervalSchedule.HOURS, start_time=datetime(2025, 6, 2, 12, 0, tzinfo=berlin))
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
    task = clocked_task(ClockedSchedule(id=next(_ids), clocked_time=CLOCKED_AT))
    assert slots.next_run(task, after) == expected


def test_clocked_time_in_other_zone_is_returned_in_utc():
    at = datetime(2025, 6, 2, 11, 30, tzinfo=ZoneInfo(BERLIN))
    task = clocked_task(ClockedSchedule(id=next(_ids), clocked_time=at))
    slot = slots.next_run(task, utc(2025, 6, 2))
    assert slot == CLOCKED_AT
    assert slot.tzinfo is UTC


def test_C07_two_tasks_sharing_one_clocked_row_get_the_same_slot():
    clocked = ClockedSchedule(id=next(_ids), clocked_time=CLOCKED_AT)
    a, b = clocked_task(clocked), clocked_task(clocked)
    now = utc(2025, 6, 2, 9, 0)
    assert slots.initial_run(a, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.initial_run(b, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.task_id_for(1, CLOCKED_AT) != slots.task_id_for(2, CLOCKED_AT)


def test_clocked_initial_run_plans_a_past_time_once():
    task = clocked_task(
        ClockedSchedule(id=next(_ids), clocked_time=CLOCKED_AT), date_changed=utc(2025, 6, 1)
    )
    now = utc(2025, 6, 2, 12, 0)  # 2.5 h late, far past the grace
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == CLOCKED_AT
    assert slots.initial_run(task, now, last_slot=CLOCKED_AT, grace=GRACE) is None


def test_one_off_interval_task_with_a_run_plans_nothing():
    task = interval_task(10, one_off=True, date_changed=utc(2025, 6, 2))
    now = utc(2025, 6, 2, 0, 5)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 0, 4, 10)
    assert slots.initial_run(task, now, last_slot=utc(2025, 6, 2, 0, 0, 10), grace=GRACE) is None


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


# DST: ISC cron rule ----------------------------------------------------------------------------

# Fixed-time jobs (no "*" in minute or hour): every slot over the whole local transition day.
FIXED_DAY_TABLE = [
    ("ny-spring-0230", "30 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    ("ny-spring-0200", "0 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    ("ny-spring-0215-0245", "15,45 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    (
        "ny-spring-0230-0330",
        "30 2,3 * * *",
        NY,
        date(2025, 3, 9),
        [utc(2025, 3, 9, 7, 0), utc(2025, 3, 9, 7, 30)],
    ),
    ("ny-spring-1604-C05", "4 16 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 20, 4)]),
    ("ny-fall-0130", "30 1 * * *", NY, date(2025, 11, 2), [utc(2025, 11, 2, 5, 30)]),
    ("ny-fall-0230", "30 2 * * *", NY, date(2025, 11, 2), [utc(2025, 11, 2, 7, 30)]),
    (
        "ny-fall-0100-0200",
        "0 1,2 * * *",
        NY,
        date(2025, 11, 2),
        [utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 7, 0)],
    ),
    ("berlin-spring-0230", "30 2 * * *", BERLIN, date(2025, 3, 30), [utc(2025, 3, 30, 1, 0)]),
    ("berlin-fall-0230", "30 2 * * *", BERLIN, date(2025, 10, 26), [utc(2025, 10, 26, 0, 30)]),
    ("sydney-spring-0230", "30 2 * * *", SYDNEY, date(2025, 10, 5), [utc(2025, 10, 4, 16, 0)]),
    ("sydney-fall-0230", "30 2 * * *", SYDNEY, date(2025, 4, 6), [utc(2025, 4, 5, 15, 30)]),
    ("kolkata-0230", "30 2 * * *", KOLKATA, date(2025, 3, 9), [utc(2025, 3, 8, 21, 0)]),
    # ISC: a stepped minute makes the job a wildcard job even with a fixed hour.
    ("ny-spring-step-min-0200", "*/30 2 * * *", NY, date(2025, 3, 9), []),
    (
        "ny-fall-step-min-0100",
        "*/30 1 * * *",
        NY,
        date(2025, 11, 2),
        [utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 30), utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 6, 30)],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "day", "expected"),
    [row[1:] for row in FIXED_DAY_TABLE],
    ids=[row[0] for row in FIXED_DAY_TABLE],
)
def test_dst_fixed_time_day(expr, tz, day, expected):
    start, end = local_day_bounds(day, tz)
    task = cron_task(expr, tz)
    assert chain(task, start - timedelta(microseconds=1), end) == expected


# Wildcard / stepped hour: every slot from local 00:00 to 05:00 on the transition day.
WINDOW_TABLE = [
    (
        "ny-spring-hourly",
        "0 * * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [utc(2025, 3, 9, 5), utc(2025, 3, 9, 6), utc(2025, 3, 9, 7), utc(2025, 3, 9, 8)],
    ),
    (
        "ny-fall-hourly",
        "0 * * * *",
        NY,
        (utc(2025, 11, 2, 4), utc(2025, 11, 2, 10)),
        [
            utc(2025, 11, 2, 4),  # 00:00 EDT
            utc(2025, 11, 2, 5),  # 01:00 EDT
            utc(2025, 11, 2, 6),  # 01:00 EST
            utc(2025, 11, 2, 7),
            utc(2025, 11, 2, 8),
            utc(2025, 11, 2, 9),
        ],
    ),
    (
        "ny-spring-every-30-min",
        "*/30 * * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [
            utc(2025, 3, 9, 5, 0), utc(2025, 3, 9, 5, 30),  # 00:00, 00:30 EST
            utc(2025, 3, 9, 6, 0), utc(2025, 3, 9, 6, 30),  # 01:00, 01:30 EST
            utc(2025, 3, 9, 7, 0), utc(2025, 3, 9, 7, 30),  # 03:00, 03:30 EDT
            utc(2025, 3, 9, 8, 0), utc(2025, 3, 9, 8, 30),
        ],
    ),
    (
        "ny-fall-every-30-min",
        "*/30 * * * *",
        NY,
        (utc(2025, 11, 2, 4), utc(2025, 11, 2, 10)),
        [
            utc(2025, 11, 2, 4, 0), utc(2025, 11, 2, 4, 30),
            utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 30),  # 01:00, 01:30 EDT
            utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 6, 30),  # 01:00, 01:30 EST
            utc(2025, 11, 2, 7, 0), utc(2025, 11, 2, 7, 30),
            utc(2025, 11, 2, 8, 0), utc(2025, 11, 2, 8, 30),
            utc(2025, 11, 2, 9, 0), utc(2025, 11, 2, 9, 30),
        ],
    ),
    (
        "ny-spring-every-2-hours",
        "0 */2 * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [utc(2025, 3, 9, 5), utc(2025, 3, 9, 8)],  # 00:00 EST, (02:00 skipped), 04:00 EDT
    ),
    (
        "berlin-spring-hourly",
        "0 * * * *",
        BERLIN,
        (utc(2025, 3, 29, 23), utc(2025, 3, 30, 3)),
        [utc(2025, 3, 29, 23), utc(2025, 3, 30, 0), utc(2025, 3, 30, 1), utc(2025, 3, 30, 2)],
    ),
    (
        "berlin-fall-hourly",
        "0 * * * *",
        BERLIN,
        (utc(2025, 10, 25, 22), utc(2025, 10, 26, 4)),
        [
            utc(2025, 10, 25, 22),
            utc(2025, 10, 25, 23),
            utc(2025, 10, 26, 0),  # 02:00 CEST
            utc(2025, 10, 26, 1),  # 02:00 CET
            utc(2025, 10, 26, 2),
            utc(2025, 10, 26, 3),
        ],
    ),
    (
        "berlin-spring-every-30-min",
        "*/30 * * * *",
        BERLIN,
        (utc(2025, 3, 29, 23), utc(2025, 3, 30, 3)),
        [
            utc(2025, 3, 29, 23, 0), utc(2025, 3, 29, 23, 30),
            utc(2025, 3, 30, 0, 0), utc(2025, 3, 30, 0, 30),
            utc(2025, 3, 30, 1, 0), utc(2025, 3, 30, 1, 30),  # 03:00, 03:30 CEST
            utc(2025, 3, 30, 2, 0), utc(2025, 3, 30, 2, 30),
        ],
    ),
    (
        "berlin-fall-every-30-min",
        "*/30 * * * *",
        BERLIN,
        (utc(2025, 10, 25, 22), utc(2025, 10, 26, 4)),
        [
            utc(2025, 10, 25, 22, 0), utc(2025, 10, 25, 22, 30),
            utc(2025, 10, 25, 23, 0), utc(2025, 10, 25, 23, 30),
            utc(2025, 10, 26, 0, 0), utc(2025, 10, 26, 0, 30),  # 02:00, 02:30 CEST
            utc(2025, 10, 26, 1, 0), utc(2025, 10, 26, 1, 30),  # 02:00, 02:30 CET
            utc(2025, 10, 26, 2, 0), utc(2025, 10, 26, 2, 30),
            utc(2025, 10, 26, 3, 0), utc(2025, 10, 26, 3, 30),
        ],
    ),
    (
        "sydney-fall-hourly",
        "0 * * * *",
        SYDNEY,
        (utc(2025, 4, 5, 13), utc(2025, 4, 5, 19)),
        [
            utc(2025, 4, 5, 13),
            utc(2025, 4, 5, 14),
            utc(2025, 4, 5, 15),  # 02:00 AEDT
            utc(2025, 4, 5, 16),  # 02:00 AEST
            utc(2025, 4, 5, 17),
            utc(2025, 4, 5, 18),
        ],
    ),
    (
        "sydney-spring-hourly",
        "0 * * * *",
        SYDNEY,
        (utc(2025, 10, 4, 14), utc(2025, 10, 4, 18)),
        [utc(2025, 10, 4, 14), utc(2025, 10, 4, 15), utc(2025, 10, 4, 16), utc(2025, 10, 4, 17)],
    ),
    (
        "sydney-fall-every-30-min",
        "*/30 * * * *",
        SYDNEY,
        (utc(2025, 4, 5, 13), utc(2025, 4, 5, 19)),
        [
            utc(2025, 4, 5, 13, 0), utc(2025, 4, 5, 13, 30),
            utc(2025, 4, 5, 14, 0), utc(2025, 4, 5, 14, 30),
            utc(2025, 4, 5, 15, 0), utc(2025, 4, 5, 15, 30),  # 02:00, 02:30 AEDT
            utc(2025, 4, 5, 16, 0), utc(2025, 4, 5, 16, 30),  # 02:00, 02:30 AEST
            utc(2025, 4, 5, 17, 0), utc(2025, 4, 5, 17, 30),
            utc(2025, 4, 5, 18, 0), utc(2025, 4, 5, 18, 30),
        ],
    ),
    (
        "sydney-spring-every-30-min",
        "*/30 * * * *",
        SYDNEY,
        (utc(2025, 10, 4, 14), utc(2025, 10, 4, 18)),
        [
            utc(2025, 10, 4, 14, 0), utc(2025, 10, 4, 14, 30),
            utc(2025, 10, 4, 15, 0), utc(2025, 10, 4, 15, 30),
            utc(2025, 10, 4, 16, 0), utc(2025, 10, 4, 16, 30),  # 03:00, 03:30 AEDT
            utc(2025, 10, 4, 17, 0), utc(2025, 10, 4, 17, 30),
        ],
    ),
    (
        "kolkata-hourly",
        "0 * * * *",
        KOLKATA,
        (utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 23, 30)),
        [
            utc(2025, 3, 8, 18, 30),
            utc(2025, 3, 8, 19, 30),
            utc(2025, 3, 8, 20, 30),
            utc(2025, 3, 8, 21, 30),
            utc(2025, 3, 8, 22, 30),
        ],
    ),
    (
        "kolkata-every-30-min",
        "*/30 * * * *",
        KOLKATA,
        (utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 23, 30)),
        [
            utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 19, 0),
            utc(2025, 3, 8, 19, 30), utc(2025, 3, 8, 20, 0),
            utc(2025, 3, 8, 20, 30), utc(2025, 3, 8, 21, 0),
            utc(2025, 3, 8, 21, 30), utc(2025, 3, 8, 22, 0),
            utc(2025, 3, 8, 22, 30), utc(2025, 3, 8, 23, 0),
        ],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "window", "expected"),
    [row[1:] for row in WINDOW_TABLE],
    ids=[row[0] for row in WINDOW_TABLE],
)
def test_dst_wildcard_window(expr, tz, window, expected):
    start, end = window
    assert chain(cron_task(expr, tz), start - timedelta(microseconds=1), end) == expected


# Wildcard jobs over the whole local transition day. All these zones move by whole hours, so
# the slots are evenly spaced in UTC: (first slot, spacing, number of slots).
WHOLE_DAY_TABLE = [
    ("ny-spring-hourly", "0 * * * *", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 23),
    ("ny-fall-hourly", "0 * * * *", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 60, 25),
    ("ny-spring-30-min", "*/30 * * * *", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 30, 46),
    ("ny-fall-30-min", "*/30 * * * *", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 30, 50),
    ("ny-spring-sunday-hourly", "0 * * * 0", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 23),
    ("ny-fall-sunday-hourly", "0 * * * 0", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 60, 25),
    ("ny-spring-monday-hourly", "0 * * * 1", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 0),
    ("berlin-spring-hourly", "0 * * * *", BERLIN, date(2025, 3, 30), utc(2025, 3, 29, 23), 60, 23),
    ("berlin-fall-hourly", "0 * * * *", BERLIN, date(2025, 10, 26), utc(2025, 10, 25, 22), 60, 25),
    ("berlin-fall-30-min", "*/30 * * * *", BERLIN, date(2025, 10, 26), utc(2025, 10, 25, 22), 30, 50),
    ("sydney-fall-hourly", "0 * * * *", SYDNEY, date(2025, 4, 6), utc(2025, 4, 5, 13), 60, 25),
    ("sydney-spring-hourly", "0 * * * *", SYDNEY, date(2025, 10, 5), utc(2025, 10, 4, 14), 60, 23),
    ("sydney-spring-30-min", "*/30 * * * *", SYDNEY, date(2025, 10, 5), utc(2025, 10, 4, 14), 30, 46),
    ("kolkata-hourly", "0 * * * *", KOLKATA, date(2025, 3, 9), utc(2025, 3, 8, 18, 30), 60, 24),
]


@pytest.mark.parametrize(
    ("expr", "tz", "day", "first", "minutes", "count"),
    [row[1:] for row in WHOLE_DAY_TABLE],
    ids=[row[0] for row in WHOLE_DAY_TABLE],
)
def test_dst_wildcard_whole_day(expr, tz, day, first, minutes, count):
    start, end = local_day_bounds(day, tz)
    found = chain(cron_task(expr, tz), start - timedelta(microseconds=1), end)
    assert found == every(first, timedelta(minutes=minutes), count)


# Day-of-week job across three Sundays around each transition (all transitions are Sundays).
WEEKLY_TABLE = [
    (
        "ny-spring",
        "30 2 * * 0",
        NY,
        utc(2025, 3, 1),
        [utc(2025, 3, 2, 7, 30), utc(2025, 3, 9, 7, 0), utc(2025, 3, 16, 6, 30)],
    ),
    (
        "ny-fall",
        "30 1 * * 0",
        NY,
        utc(2025, 10, 25),
        [utc(2025, 10, 26, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 9, 6, 30)],
    ),
    (
        "berlin-spring",
        "30 2 * * 0",
        BERLIN,
        utc(2025, 3, 22),
        [utc(2025, 3, 23, 1, 30), utc(2025, 3, 30, 1, 0), utc(2025, 4, 6, 0, 30)],
    ),
    (
        "berlin-fall",
        "30 2 * * 0",
        BERLIN,
        utc(2025, 10, 18),
        [utc(2025, 10, 19, 0, 30), utc(2025, 10, 26, 0, 30), utc(2025, 11, 2, 1, 30)],
    ),
    (
        "sydney-fall",
        "30 2 * * 0",
        SYDNEY,
        utc(2025, 3, 28),
        [utc(2025, 3, 29, 15, 30), utc(2025, 4, 5, 15, 30), utc(2025, 4, 12, 16, 30)],
    ),
    (
        "sydney-spring",
        "30 2 * * 0",
        SYDNEY,
        utc(2025, 9, 26),
        [utc(2025, 9, 27, 16, 30), utc(2025, 10, 4, 16, 0), utc(2025, 10, 11, 15, 30)],
    ),
    (
        "kolkata",
        "30 2 * * 0",
        KOLKATA,
        utc(2025, 2, 28),
        [utc(2025, 3, 1, 21, 0), utc(2025, 3, 8, 21, 0), utc(2025, 3, 15, 21, 0)],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [row[1:] for row in WEEKLY_TABLE],
    ids=[row[0] for row in WEEKLY_TABLE],
)
def test_dst_day_of_week(expr, tz, after, expected):
    assert take(cron_task(expr, tz), after, 3) == expected


# next_run from an instant inside the skipped or repeated hour.
MID_TRANSITION_TABLE = [
    ("ny-fixed-before-gap", "30 2 * * *", NY, utc(2025, 3, 9, 6, 59, 59), utc(2025, 3, 9, 7, 0)),
    ("ny-fixed-at-gap", "30 2 * * *", NY, utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30)),
    ("ny-fixed-first-pass", "15 1 * * *", NY, utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 15)),
    ("ny-fixed-first-pass-gone", "45 1 * * *", NY, utc(2025, 11, 2, 5, 50), utc(2025, 11, 3, 6, 45)),
    ("ny-fixed-second-pass", "30 1 * * *", NY, utc(2025, 11, 2, 6, 0), utc(2025, 11, 3, 6, 30)),
    ("ny-hourly-first-pass", "0 * * * *", NY, utc(2025, 11, 2, 5, 30), utc(2025, 11, 2, 6, 0)),
    ("ny-hourly-second-pass", "0 * * * *", NY, utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 7, 0)),
    ("ny-45-first-pass", "45 * * * *", NY, utc(2025, 11, 2, 5, 50), utc(2025, 11, 2, 6, 45)),
    ("sydney-fixed-second-pass", "30 2 * * *", SYDNEY, utc(2025, 4, 5, 16, 0), utc(2025, 4, 6, 16, 30)),
    ("sydney-fixed-before-gap", "30 2 * * *", SYDNEY, utc(2025, 10, 4, 15, 59), utc(2025, 10, 4, 16, 0)),
]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [row[1:] for row in MID_TRANSITION_TABLE],
    ids=[row[0] for row in MID_TRANSITION_TABLE],
)
def test_dst_next_run_inside_transition(expr, tz, after, expected):
    assert slots.next_run(cron_task(expr, tz), after) == expected


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
    task = cron_task(
        "0 * * * *", start_time=utc(2025, 6, 2, 14, 0), expires=utc(2025, 6, 2, 17, 0)
    )
    assert slots.next_run(task, utc(2025, 6, 1)) == utc(2025, 6, 2, 14, 0)
    assert chain(task, utc(2025, 6, 1), utc(2025, 6, 3)) == [
        utc(2025, 6, 2, 14), utc(2025, 6, 2, 15), utc(2025, 6, 2, 16)
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
        uuid.uuid5(uuid.UUID("6f1c8a52-5d7e-4b7a-9a51-3c1f1e0b7d21"), "1@2025-01-01T00:00:00.000000+00:00")
    )


# Errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("every", "period"), [(0, "seconds"), (-5, "minutes"), (1, "fortnights")])
def test_bad_interval_raises_schedule_error(every, period):
    task = interval_task(every, period, date_changed=utc(2025, 1, 1))
    with pytest.raises(ScheduleError):
        slots.next_run(task, utc(2025, 1, 1))


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30,31 2 *", "0 0 31 4,6,9,11 *"])
def test_crontab_that_never_matches_raises_schedule_error(expr):
    with pytest.raises(ScheduleError, match="never occurs"):
        slots.next_run(cron_task(expr), utc(2025, 1, 1))


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
    "expr", ["61 * * * *", "0 24 * * *", "0 0 32 * *", "0 0 * 13 *", "0 0 * * 8", "*/0 * * * *", "x * * * *"]
)
def test_invalid_crontab_field_raises_schedule_error(expr):
    with pytest.raises(ScheduleError, match="invalid crontab"):
        slots.next_run(cron_task(expr), utc(2025, 1, 1))


def test_solar_without_ephem_raises_schedule_error():
    try:
        import ephem  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("ephem is installed")
    solar = SolarSchedule(id=next(_ids), event="sunrise", latitude=52.52, longitude=13.40)
    task = PeriodicTask(name="solar", task="project.tasks.record", solar=solar)
    with pytest.raises(ScheduleError, match="pip install ephem"):
        slots.next_run(task, utc(2025, 1, 1))


def test_task_without_schedule_raises_schedule_error():
    task = PeriodicTask(name="none", task="project.tasks.record")
    with pytest.raises(ScheduleError, match="no schedule"):
        slots.next_run(task, utc(2025, 1, 1))


@pytest.mark.parametrize(
    "task", [interval_task(5, date_changed=utc(2025, 1, 1)), cron_task("0 * * * *")], ids=["interval", "crontab"]
)
def test_naive_after_raises_value_error(task):
    with pytest.raises(ValueError, match="aware"):
        slots.next_run(task, datetime(2025, 1, 1, 12, 0))


# Properties ------------------------------------------------------------------------------------

DST_ZONES = [
    NY,
    BERLIN,
    SYDNEY,
    "Australia/Lord_Howe",  # 30-minute DST shift
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Sao_Paulo",  # midnight transitions until 2019
    "America/Havana",  # midnight transitions
    "America/St_Johns",  # -03:30 / -02:30
    "Europe/Dublin",
    "Africa/Casablanca",  # Ramadan shifts
]
ALL_ZONES = ["UTC", KOLKATA, *DST_ZONES]
YEARS = (2012, 2032)
PROPS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@cache
def transitions(tz: str) -> tuple[datetime, ...]:
    """Return the UTC instants (to the minute) at which ``tz`` changes its offset in YEARS."""
    zone = ZoneInfo(tz)
    found: list[datetime] = []
    day = utc(YEARS[0], 1, 1)
    end = utc(YEARS[1] + 1, 1, 1)
    while day < end:
        nxt = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = day, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid <= lo:
                    mid = lo + timedelta(minutes=1)
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        day = nxt
    return tuple(found)


def near_transition(tz: str, start: datetime, end: datetime, margin: timedelta) -> bool:
    return any(start - margin <= t <= end + margin for t in transitions(tz))


def field(lo: int, hi: int) -> st.SearchStrategy[str]:
    """Cron field text both Celery and croniter read the same way (no ``a-a`` ranges)."""
    n = st.integers(lo, hi)
    pair = st.lists(n, min_size=2, max_size=2, unique=True).map(sorted)
    return st.one_of(
        st.just("*"),
        st.integers(2, max(2, (hi - lo + 1) // 2)).map(lambda s: f"*/{s}"),
        n.map(str),
        pair.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.tuples(pair, st.integers(2, 10)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}"),
        st.lists(n, min_size=2, max_size=4, unique=True).map(lambda xs: ",".join(map(str, sorted(xs)))),
    )


def mostly_star(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.just("*"), strategy)


# Day of month 1-28 so that every expression matches some day within a few years.
CRON_EXPR = st.tuples(
    field(0, 59), field(0, 23), mostly_star(field(1, 28)), mostly_star(field(1, 12)),
    mostly_star(field(0, 6)),
).map(" ".join)
# Sparser minutes for tests that chain across whole days.
SPARSE_MINUTE = st.one_of(
    st.integers(0, 59).map(str),
    st.lists(st.integers(0, 59), min_size=2, max_size=3, unique=True).map(
        lambda xs: ",".join(map(str, sorted(xs)))
    ),
    st.integers(10, 30).map(lambda s: f"*/{s}"),
    st.tuples(st.integers(0, 50), st.integers(1, 9)).map(lambda p: f"{p[0]}-{p[0] + p[1]}"),
)
DENSE_DAY_EXPR = st.tuples(
    SPARSE_MINUTE, field(0, 23), mostly_star(field(1, 28)), st.just("*"), mostly_star(field(0, 6))
).map(" ".join)

INSTANT = st.datetimes(
    min_value=datetime(YEARS[0], 1, 2), max_value=datetime(YEARS[1], 12, 1), timezones=st.just(UTC)
)


@st.composite
def zone_and_instant(draw, zones=tuple(ALL_ZONES)):
    """A zone and an instant, half of the time within 36 hours of one of its transitions."""
    tz = draw(st.sampled_from(zones))
    moments = transitions(tz)
    if moments and draw(st.booleans()):
        center = draw(st.sampled_from(moments))
        offset = draw(st.integers(-36 * 3600, 36 * 3600))
        return tz, center + timedelta(seconds=offset, microseconds=draw(st.integers(0, 999_999)))
    return tz, draw(INSTANT)


def parsed(expr: str) -> schedules.crontab:
    minute, hour, dom, month, dow = expr.split()
    return schedules.crontab(
        minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
    )


def wall_matches(cron: schedules.crontab, wall: datetime) -> bool:
    return (
        wall.minute in cron.minute
        and wall.hour in cron.hour
        and wall.day in cron.day_of_month
        and wall.month in cron.month_of_year
        and wall.isoweekday() % 7 in cron.day_of_week
    )


def is_fixed(expr: str) -> bool:
    minute, hour = expr.split()[:2]
    return "*" not in minute and "*" not in hour


def brute_force(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    """Return the ISC-rule slots in ``(after, until]`` by testing every UTC minute.

    A wildcard job fires at every minute whose local wall time matches. A fixed-time job fires
    at the first occurrence (fold 0) of a matching wall time, and at a spring-forward instant
    when a matching wall time lies in the skipped gap.
    """
    zone = ZoneInfo(tz)
    cron = parsed(expr)
    fixed = is_fixed(expr)
    found: list[datetime] = []
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    previous_offset = (t - timedelta(minutes=1)).astimezone(zone).utcoffset()
    while t <= until:
        local = t.astimezone(zone)
        offset = local.utcoffset()
        hit = wall_matches(cron, local.replace(tzinfo=None)) and (not fixed or local.fold == 0)
        if fixed and not hit and offset > previous_offset:
            wall = (t + previous_offset).replace(tzinfo=None)
            while wall < (t + offset).replace(tzinfo=None) and not hit:
                hit = wall_matches(cron, wall)
                wall += timedelta(minutes=1)
        if hit:
            found.append(t)
        previous_offset = offset
        t += timedelta(minutes=1)
    return found


@PROPS
@given(zone_and_instant(), DENSE_DAY_EXPR)
def test_property_crontab_agrees_with_brute_force_isc_rule(zone_instant, expr):
    tz, after = zone_instant
    until = after + timedelta(hours=30)
    task = cron_task(expr, tz)
    assert chain(task, after, until + timedelta(microseconds=1)) == brute_force(expr, tz, after, until)


@PROPS
@given(zone_and_instant(), CRON_EXPR, st.data())
def test_property_crontab_slots_increase_and_next_run_is_the_least(zone_instant, expr, data):
    tz, after = zone_instant
    task = cron_task(expr, tz)
    found = take(task, after, 12)
    assert len(found) == 12
    assert all(s.tzinfo is UTC for s in found)
    assert after < found[0]
    assert all(a < b for a, b in itertools.pairwise(found))
    # From any instant between two slots, next_run is the later one.
    i = data.draw(st.integers(0, len(found) - 2))
    gap = (found[i + 1] - found[i]) // timedelta(microseconds=1)
    probe = found[i] + timedelta(microseconds=data.draw(st.integers(0, gap - 1)))
    assert slots.next_run(task, probe) == found[i + 1]


@PROPS
@given(zone_and_instant(), CRON_EXPR)
def test_property_crontab_slots_match_expression_in_local_time(zone_instant, expr):
    tz, after = zone_instant
    zone = ZoneInfo(tz)
    cron = parsed(expr)
    for slot in take(cron_task(expr, tz), after, 12):
        local = slot.astimezone(zone)
        if wall_matches(cron, local.replace(tzinfo=None)):
            assert local.second == 0 and local.microsecond == 0
            continue
        # Only a fixed-time job moved to a spring-forward instant may not match its wall time.
        before = (slot - timedelta(seconds=1)).astimezone(zone).utcoffset()
        assert is_fixed(expr), (slot, local)
        assert local.utcoffset() > before, (slot, local)
        gap_start = (slot + before).replace(tzinfo=None)
        gap = [gap_start + timedelta(minutes=m) for m in range((local.utcoffset() - before) // timedelta(minutes=1))]
        assert any(wall_matches(cron, wall) for wall in gap), (slot, local)


@PROPS
@given(zone_and_instant(zones=tuple(DST_ZONES)), st.integers(0, 59), st.integers(0, 23))
def test_property_fixed_local_time_runs_once_per_local_date(zone_instant, minute, hour):
    tz, after = zone_instant
    zone = ZoneInfo(tz)
    after -= timedelta(days=2)
    found = take(cron_task(f"{minute} {hour} * * *", tz), after, 5)
    dates = [s.astimezone(zone).date() for s in found]
    assert len(set(dates)) == len(dates) == 5
    # One slot per calendar day: five consecutive local dates.
    assert [(d - dates[0]).days for d in dates] == [0, 1, 2, 3, 4]


INTERVAL_PERIOD = st.sampled_from(
    [IntervalSchedule.SECONDS, IntervalSchedule.MINUTES, IntervalSchedule.HOURS, IntervalSchedule.DAYS]
)


@PROPS
@given(
    st.integers(1, 1000),
    INTERVAL_PERIOD,
    INSTANT,
    st.one_of(st.none(), INSTANT),
    st.integers(-10**9, 10**9),
)
def test_property_interval_slots_are_exactly_every_apart(n, period, changed, start_time, shift):
    task = interval_task(n, period, date_changed=changed, start_time=start_time)
    step = timedelta(**{period: n})
    anchor = start_time if start_time is not None else changed + step
    after = anchor + timedelta(seconds=shift)
    found = take(task, after, 10)
    assert found[0] > after
    assert found[0] == anchor or found[0] - step <= after
    assert (found[0] - anchor) % step == timedelta(0)
    assert [b - a for a, b in itertools.pairwise(found)] == [step] * 9


@PROPS
@given(
    st.integers(1, 120),
    INSTANT,
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.one_of(st.none(), st.integers(0, 5000)),
)
def test_property_interval_slots_through_agrees_with_chaining(n, anchor, k, until_s, expires_s):
    expires = None if expires_s is None else anchor + timedelta(seconds=expires_s)
    task = interval_task(n, start_time=anchor, expires=expires)
    slot = anchor + k * timedelta(seconds=n)
    assume(expires is None or slot < expires)
    until = slot + timedelta(seconds=until_s)
    counted = chain(task, slot, until + timedelta(microseconds=1))
    assert slots.slots_through(task, slot, until) == (len(counted), slots.next_run(task, until))


@PROPS
@given(zone_and_instant(), DENSE_DAY_EXPR, st.integers(0, 48 * 3600), st.one_of(st.none(), st.integers(0, 48 * 3600)))
def test_property_crontab_slots_through_agrees_with_chaining(zone_instant, expr, until_s, expires_s):
    tz, after = zone_instant
    expires = None if expires_s is None else after + timedelta(seconds=expires_s)
    task = cron_task(expr, tz, expires=expires)
    slot = slots.next_run(task, after)
    assume(slot is not None)
    until = slot + timedelta(seconds=until_s)
    counted = chain(task, slot, until + timedelta(microseconds=1))
    assert slots.slots_through(task, slot, until) == (len(counted), slots.next_run(task, until))


def croniter_slots(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    it = croniter(expr, after.astimezone(ZoneInfo(tz)), day_or=False)
    return [it.get_next(datetime).astimezone(UTC) for _ in range(n)]


@PROPS
@given(st.sampled_from(["UTC", KOLKATA]), INSTANT.map(lambda d: d.replace(microsecond=0)), CRON_EXPR)
def test_property_crontab_agrees_with_croniter_without_dst(tz, after, expr):
    assert take(cron_task(expr, tz), after, 8) == croniter_slots(expr, tz, after, 8)


@PROPS
@given(st.sampled_from([NY, BERLIN, SYDNEY]), INSTANT.map(lambda d: d.replace(microsecond=0)), CRON_EXPR)
def test_property_crontab_agrees_with_croniter_away_from_transitions(tz, after, expr):
    task = cron_task(expr, tz)
    ours = take(task, after, 6)
    theirs = croniter_slots(expr, tz, after, 6)
    previous = after
    for mine, other in zip(ours, theirs, strict=True):
        if near_transition(tz, previous, mine, timedelta(days=2)):
            break
        assert mine == other
        previous = mine
