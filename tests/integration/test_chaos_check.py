"""The chaos run's checker on a hand-made ledger and execution log: each breach is caught."""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduling import slots
from scheduling.models import Run
from tools import chaos

pytestmark = pytest.mark.django_db(transaction=True)

IDENT = "chaos-test"


@pytest.fixture
def planted(make_task):
    task = make_task(every=1, name=f"{IDENT} #0 interval")
    first = slots.initial_run(task, task.date_changed, last_slot=None, grace=timedelta(0))
    return task, chaos.Planted(task.pk, "interval", first)


def _run(task, slot, task_id: str, status: str = "succeeded", **fields) -> None:
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        status=status, task_id=task_id, **fields,
    )


def _log(task_id: str, pgid: int = 1) -> dict[str, object]:
    return {"task_id": task_id, "pgid": pgid, "phase": "end"}


def test_every_slot_gets_one_outcome_and_each_breach_is_counted(planted):
    task, plant = planted
    s = [plant.first_slot + timedelta(seconds=n) for n in range(6)]
    _run(task, s[0], "a")
    _run(task, s[1], "b", slots=2, reason="misfire: coalesced 2 slots")  # stands for s[2] too
    # s[3]: no row at all
    _run(task, s[4], "c")  # executed by a worker that was SIGKILLed, then again on redelivery
    _run(task, s[5], "d", status="failed", reason="worker lost", executions=1)
    _run(task, s[4] + timedelta(milliseconds=500), "e")  # not on the task's grid
    executions = [_log("a"), _log("b"), _log("c", pgid=66), _log("c", pgid=2), _log("zz")]

    report = chaos.check(IDENT, [plant], s[5], executions, chaos.Report(), killed_groups={66})

    assert report.slots == 6
    assert dict(report.outcomes) == {
        "executed once": 1,
        "executed once, coalescing a misfire": 1,
        "coalesced into a late run": 1,
        "executed again: its worker was killed, the message redelivered": 1,
        "failed: worker lost, executed 0x": 1,
    }
    assert {k: n for k, n in report.breaches.items() if n} == {
        "unaccounted slots": 1, "off-schedule runs": 1, "executions of no run": 1,
    }
    assert not report.ok


def test_two_executions_by_live_workers_and_stuck_runs_are_breaches(planted):
    task, plant = planted
    s = [plant.first_slot + timedelta(seconds=n) for n in range(3)]
    _run(task, s[0], "a")
    _run(task, s[1], "b", status="dispatched")
    _run(task, s[2], "c", status="missed", reason="")
    executions = [_log("a", pgid=1), _log("a", pgid=2)]

    report = chaos.check(IDENT, [plant], s[2], executions, chaos.Report(), killed_groups={3})

    assert {k: n for k, n in report.breaches.items() if n} == {
        "duplicate executions": 1, "stuck runs": 1, "closed without a reason": 1,
    }
    assert (report.duplicates, report.unaccounted) == (1, 0)
    assert "PASS" not in report.table()
