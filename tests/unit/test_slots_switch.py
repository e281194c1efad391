"""Switching from django-celery-beat's stock DatabaseScheduler: ``last_run_at`` is the previous run.

Stock beat writes ``last_run_at`` (the instant it sent a run) and, by saving the whole task,
``date_changed`` at each sync. The first ledger slot never repeats a run stock beat sent, never
comes less than one interval after it, and a slot that fell between the two schedulers is planned
(the claim's misfire policy then decides), not dropped.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django_celery_beat.models import ClockedSchedule

from scheduling import slots
from tests.unit.slot_factories import (
    GRACE,
    clocked_task,
    cron_task,
    interval_task,
    next_id,
    utc,
)

MS = timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("date_changed", "last_run_at", "now", "expected"),
    [
        # stock beat ran 11:59:55 and saved 11:59:58: first grid slot (date_changed + 10k) at or
        # after 12:00:05 is 12:00:08
        (utc(2025, 6, 2, 11, 59, 58), utc(2025, 6, 2, 11, 59, 55), utc(2025, 6, 2, 11, 59, 59),
         utc(2025, 6, 2, 12, 0, 8)),
        # last_run_at written without a save (off the grid 11:00:10 + 10k): not 12:00:00, which
        # is only 7 s after stock's run, but 12:00:10
        (utc(2025, 6, 2, 11, 0, 0), utc(2025, 6, 2, 11, 59, 53), utc(2025, 6, 2, 11, 59, 56),
         utc(2025, 6, 2, 12, 0, 10)),
        # last_run_at on the grid (the ledger's own): simply the next grid slot
        (utc(2025, 6, 2, 11, 0, 0), utc(2025, 6, 2, 11, 59, 50), utc(2025, 6, 2, 11, 59, 56),
         utc(2025, 6, 2, 12, 0, 0)),
    ],
)
def test_interval_first_slot_is_at_least_one_interval_after_stock_last_run(
    date_changed, last_run_at, now, expected
):
    task = interval_task(10, date_changed=date_changed, last_run_at=last_run_at)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == expected


def test_crontab_slot_stock_beat_already_sent_is_not_sent_again():
    # stock beat sent the 14:00 run at 14:00:00.3 and saved at 14:00:00.5; switch at 14:00:20
    task = cron_task("0 * * * *", date_changed=utc(2025, 6, 2, 14, 0, 0) + 500 * MS,
                     last_run_at=utc(2025, 6, 2, 14, 0, 0) + 300 * MS)
    now = utc(2025, 6, 2, 14, 0, 20)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 15)


def test_crontab_slot_between_the_two_schedulers_is_planned_however_old():
    # C04 at the switch: stock beat ran 13:00 and stopped at 13:59; the ledger starts at 14:05.
    # 14:00 is planned (5 minutes old): the claim's misfire policy decides (coalesce runs it).
    task = cron_task("0 * * * *", date_changed=utc(2025, 6, 2, 13, 2, 30),
                     last_run_at=utc(2025, 6, 2, 13, 0, 0) + 300 * MS)
    now = utc(2025, 6, 2, 14, 5)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == utc(2025, 6, 2, 14)
    # once the ledger has a run of the task, the usual grace floor applies again
    assert slots.initial_run(
        task, now, last_slot=utc(2025, 6, 2, 13), grace=GRACE
    ) == utc(2025, 6, 2, 15)


def _clocked(at):
    return ClockedSchedule(pk=next_id(), clocked_time=at)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # stock beat 2.9 sent it at 09:00:00.4 and stopped before its next tick, which would have
        # disabled it: enabled, last_run_at and total_run_count=1 are left. Not sent again.
        ({"last_run_at": utc(2025, 6, 2, 9) + 400 * MS, "total_run_count": 1}, None),
        # the count alone (last_run_at cleared by a save of the disabled task, then re-enabled)
        ({"last_run_at": None, "total_run_count": 1}, None),
        # last_run_at alone, at or after the clocked time
        ({"last_run_at": utc(2025, 6, 2, 9), "total_run_count": 0}, None),
        # never sent by stock beat: its one slot, however old
        ({"last_run_at": None, "total_run_count": 0}, utc(2025, 6, 2, 9)),
        # re-armed the stock way (disabled, enabled with a new clocked time): last_run_at from an
        # earlier clocked time, count reset: the new time runs
        ({"last_run_at": utc(2025, 6, 1, 9) + 400 * MS, "total_run_count": 0}, utc(2025, 6, 2, 9)),
    ],
)
def test_clocked_one_off_stock_beat_already_sent_is_not_sent_again(fields, expected):
    task = clocked_task(_clocked(utc(2025, 6, 2, 9)), date_changed=utc(2025, 6, 1, 8), **fields)
    now = utc(2025, 6, 2, 9, 0, 20)
    assert slots.initial_run(task, now, last_slot=None, grace=GRACE) == expected


def test_clocked_one_off_the_ledger_ran_and_re_armed_runs_again_whatever_stock_counted():
    # the ledger's own history decides once it has a run: a new clocked time is a new slot
    task = clocked_task(_clocked(utc(2025, 6, 3, 9)), date_changed=utc(2025, 6, 2, 10),
                        last_run_at=utc(2025, 6, 2, 9), total_run_count=1)
    now = utc(2025, 6, 2, 10)
    assert slots.initial_run(
        task, now, last_slot=utc(2025, 6, 2, 9), grace=GRACE
    ) == utc(2025, 6, 3, 9)
