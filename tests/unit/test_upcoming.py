"""Upcoming runs equal ``slots.next_run`` chained (issue 16, acceptance 2), with their zones.

Four cases: an interval, a crontab in Europe/Berlin across the spring-forward of 2027-03-28
(CET +01:00 -> CEST +02:00 at 01:00 UTC; 02:xx local is skipped, so the fixed-time 02:30 job
runs once at the transition instant, 03:00 CEST), a clocked one-off, and a disabled task (none).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django_celery_beat.models import ClockedSchedule

from scheduling.upcoming import format_offset, upcoming_runs, upcoming_slots
from tests.unit.slot_factories import (
    BERLIN,
    clocked_task,
    cron_task,
    interval_task,
    next_id,
    take,
    utc,
)

AFTER = utc(2027, 3, 24, 0, 0)


def test_an_interval_is_next_run_chained_on_its_grid():
    task = interval_task(90, start_time=utc(2027, 3, 23, 23, 59, 30))
    expected = [utc(2027, 3, 24, 0, 1, 0) + k * timedelta(seconds=90) for k in range(10)]
    assert upcoming_slots(task, AFTER) == expected == take(task, AFTER, 10)


def test_a_berlin_crontab_across_the_2027_spring_forward():
    task = cron_task("30 2 * * *", BERLIN)
    runs = upcoming_runs(task, AFTER, 7)
    assert [run.slot for run in runs] == take(task, AFTER, 7) == [
        utc(2027, 3, 24, 1, 30),
        utc(2027, 3, 25, 1, 30),
        utc(2027, 3, 26, 1, 30),
        utc(2027, 3, 27, 1, 30),
        utc(2027, 3, 28, 1, 0),  # 02:30 does not exist: the transition instant, 03:00 CEST
        utc(2027, 3, 29, 0, 30),
        utc(2027, 3, 30, 0, 30),
    ]
    assert [run.local.strftime("%Y-%m-%d %H:%M %Z") for run in runs] == [
        "2027-03-24 02:30 CET",
        "2027-03-25 02:30 CET",
        "2027-03-26 02:30 CET",
        "2027-03-27 02:30 CET",
        "2027-03-28 03:00 CEST",
        "2027-03-29 02:30 CEST",
        "2027-03-30 02:30 CEST",
    ]
    assert [run.offset for run in runs] == ["+01:00"] * 4 + ["+02:00"] * 3
    assert [run.dst_note for run in runs] == [
        "", "", "", "", "DST change: UTC offset +01:00 -> +02:00", "", "",
    ]
    assert {run.zone for run in runs} == {BERLIN}


def test_a_clocked_one_off_has_its_one_slot_and_none_once_it_passed():
    clocked = ClockedSchedule(id=next_id(), clocked_time=utc(2027, 3, 25, 12, 0))
    task = clocked_task(clocked)
    assert upcoming_slots(task, AFTER) == take(task, AFTER, 10) == [utc(2027, 3, 25, 12, 0)]
    assert upcoming_slots(task, utc(2027, 3, 25, 12, 0)) == []


def test_a_one_off_interval_has_one_slot():
    task = interval_task(60, one_off=True, start_time=utc(2027, 3, 24, 0, 1))
    assert upcoming_slots(task, AFTER) == [utc(2027, 3, 24, 0, 1)]


def test_a_disabled_task_has_none():
    task = cron_task("30 2 * * *", BERLIN, enabled=False)
    assert take(task, AFTER, 3) != []  # its schedule has slots; being disabled hides them
    assert upcoming_slots(task, AFTER) == []
    assert upcoming_runs(task, AFTER) == []


def test_expires_ends_the_list():
    task = interval_task(60, start_time=utc(2027, 3, 24, 0, 1), expires=utc(2027, 3, 24, 0, 4))
    assert upcoming_slots(task, AFTER) == [
        utc(2027, 3, 24, 0, 1), utc(2027, 3, 24, 0, 2), utc(2027, 3, 24, 0, 3),
    ]


def test_count_zero_and_negative():
    task = interval_task(60, start_time=AFTER)
    assert upcoming_slots(task, AFTER, 0) == []
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        upcoming_slots(task, AFTER, -1)


def test_offsets_are_formatted_with_sign_and_minutes():
    assert [format_offset(timedelta(minutes=m)) for m in (60, -240, 330, 0)] == [
        "+01:00", "-04:00", "+05:30", "+00:00",
    ]
