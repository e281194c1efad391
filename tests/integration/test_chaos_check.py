"""The chaos run's checker on a hand-made ledger and execution log: each breach is caught."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from scheduling import slots
from scheduling.models import Run
from tools import chaos

pytestmark = pytest.mark.django_db(transaction=True)

IDENT = "chaos-test"
LIMIT = 3  # SCHEDULING_REPUBLISH_LIMIT of the hand-made ledger


def _plant(make_task, n: int, policy: str = "fail"):
    task = make_task(every=1, name=f"{IDENT} #{n} interval")
    first = slots.initial_run(task, task.date_changed, last_slot=None, grace=timedelta(0))
    return task, chaos.Planted(task.pk, "interval", first, policy)


@pytest.fixture
def planted(make_task):
    return _plant(make_task, 0)


def _run(task, slot, task_id: str, status: str = "succeeded", **fields) -> None:
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        status=status, task_id=task_id, **fields,
    )


def _log(task_id: str, pgid: int = 1, phase: str = "end") -> dict[str, object]:
    return {"task_id": task_id, "pgid": pgid, "phase": phase}


def _check(plants, end, executions, starts=(), killed_groups=frozenset(), kills=()):
    return chaos.check(
        IDENT, plants, end, executions, chaos.Report(), killed_groups=set(killed_groups),
        starts=[_log(task_id, phase="start") for task_id in starts], republish_limit=LIMIT,
        kills=list(kills),
    )


def _breaches(report: chaos.Report) -> dict[str, int]:
    return {k: n for k, n in report.breaches.items() if n}


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

    report = _check([plant], s[5], executions, starts=["a", "b", "c", "c", "d"],
                    killed_groups={66})

    assert report.slots == 6
    assert dict(report.outcomes) == {
        "executed once": 1,
        "executed once, coalescing a misfire": 1,
        "coalesced into a late run": 1,
        "executed again: its worker was killed, the message redelivered": 1,
        "failed: worker lost (fail), executed 0x": 1,
    }
    assert _breaches(report) == {
        "unaccounted slots": 1, "off-schedule runs": 1, "executions of no run": 1,
    }
    assert not report.ok


def test_two_executions_by_live_workers_and_stuck_runs_are_breaches(planted):
    task, plant = planted
    s = [plant.first_slot + timedelta(seconds=n) for n in range(3)]
    _run(task, s[0], "a")
    _run(task, s[1], "b", status="running", executions=1)
    _run(task, s[2], "c", status="missed", reason="")
    executions = [_log("a", pgid=1), _log("a", pgid=2)]

    report = _check([plant], s[2], executions, starts=["a", "a", "b"], killed_groups={3})

    assert _breaches(report) == {
        "duplicate executions": 1, "stuck runs": 1, "closed without a reason": 1,
    }
    assert (report.duplicates, report.unaccounted) == (1, 0)
    assert "PASS" not in report.table()


def test_a_run_lost_after_dispatch_is_a_breach_unless_recovered(planted):
    """Invariant 9: a message lost in the broker leaves its run dispatched; re-published and
    executed, or closed "not delivered", it is accounted for."""
    task, plant = planted
    s = [plant.first_slot + timedelta(seconds=n) for n in range(4)]
    _run(task, s[0], "lost", status="dispatched")  # never executed, never re-published
    _run(task, s[1], "lost-again", status="dispatched", republished=2,
         reason="re-published (2 of 3): no worker started it within 10 s")
    _run(task, s[2], "recovered", republished=1,
         reason="re-published (1 of 3): no worker started it within 10 s")
    _run(task, s[3], "closed", status="failed", reason="not delivered", republished=LIMIT,
         error="no worker started it within 10 s of its dispatch nor of any of its 3 re-publishes")

    report = _check([plant], s[3], [_log("recovered")], starts=["recovered"])

    assert _breaches(report) == {"runs lost after dispatch": 2}
    assert dict(report.outcomes) == {
        "lost after dispatch": 2,
        "executed once, after a re-publish": 1,
        "failed: not delivered, executed 0x": 1,
    }
    assert "runs lost after dispatch: " in "\n".join(report.examples)
    assert "re-published 2x" in "\n".join(report.examples)


def test_worker_lost_is_accepted_only_for_fail_tasks_whose_body_started(make_task):
    fail_task, fail_plant = _plant(make_task, 0, "fail")
    s = [fail_plant.first_slot + timedelta(seconds=n) for n in range(2)]
    _run(fail_task, s[0], "started", status="failed", reason="worker lost", executions=1)
    _run(fail_task, s[1], "never-began", status="failed", reason="worker lost", executions=1)

    report = _check([fail_plant], s[1], [], starts=["started"])

    assert _breaches(report) == {"worker lost without a start": 1}
    assert report.outcomes["failed: worker lost (fail), executed 0x"] == 2
    assert "never-began" in "\n".join(report.examples)


def test_a_worker_killed_between_the_guards_start_and_the_bodys_first_line(make_task):
    """The guard's start is the last step before the body: a SIGKILL of that worker right after
    it (no start line yet) is the one "worker lost" without a start that is accounted for."""
    task, plant = _plant(make_task, 0, "fail")
    s = [plant.first_slot + timedelta(seconds=n) for n in range(3)]
    t = plant.first_slot + timedelta(minutes=1)
    started = {"gap": t, "late-kill": t - chaos.BODY_GAP - timedelta(seconds=1), "other-worker": t}
    for n, (task_id, at) in enumerate(started.items()):
        _run(task, s[n], task_id, status="failed", reason="worker lost", executions=1,
             started_at=at, worker=f"{IDENT}-worker-{1 if n < 2 else 2}@host")
    # worker-1 killed 40 ms after the guard started "gap" (and long after "late-kill" began);
    # worker-3, not "other-worker"'s worker-2, killed 10 ms after.
    kills = [(f"{IDENT}-worker-1", t + timedelta(milliseconds=40)),
             (f"{IDENT}-worker-3", t + timedelta(milliseconds=10))]

    report = _check([plant], s[2], [], kills=kills)

    assert report.outcomes["failed: worker lost, killed before its body's first line (fail)"] == 1
    assert _breaches(report) == {"worker lost without a start": 2}
    examples = "\n".join(report.examples)
    assert "late-kill" in examples and "other-worker" in examples and "task id gap" not in examples


def test_a_recover_task_closed_as_worker_lost_before_its_republishes_ran_out_is_a_breach(
    make_task,
):
    task, plant = _plant(make_task, 0, "recover")
    s = [plant.first_slot + timedelta(seconds=n) for n in range(4)]
    # Under recover the sweep re-publishes and the redelivery runs: "worker lost" is wrong here.
    _run(task, s[0], "closed-early", status="failed", reason="worker lost", executions=1)
    _run(task, s[1], "closed-after-one", status="failed", reason="worker lost", executions=2,
         republished=1)
    # Re-published the most times allowed and lost again: closed worker lost, as documented.
    _run(task, s[2], "exhausted", status="failed", reason="worker lost", executions=LIMIT + 1,
         republished=LIMIT)
    # Lost mid-body once, recovered, then executed to the end.
    _run(task, s[3], "recovered", executions=2, republished=1,
         reason="recovered: re-published after its worker was lost")
    starts = ["closed-early", "closed-after-one", "closed-after-one", *["exhausted"] * 4,
              "recovered", "recovered"]

    report = _check([plant], s[3], [_log("recovered", pgid=2)], starts=starts)

    assert _breaches(report) == {"recover runs closed as worker lost": 2}
    assert dict(report.outcomes) == {
        "failed: worker lost (recover), executed 0x": 3,
        "executed once more after its worker was lost mid-body (recover)": 1,
    }
    examples = "\n".join(report.examples)
    assert "closed-early (re-published 0x of 3)" in examples
    assert "closed-after-one (re-published 1x of 3)" in examples


def test_the_table_lists_every_breach_kind_and_the_faults(planted):
    task, plant = planted
    _run(task, plant.first_slot, "a")
    report = _check([plant], plant.first_slot, [_log("a")], starts=["a"])
    report.faults.update({"broker queue purged": 2, "broker connections cut": 3})

    table = report.table()

    assert report.ok and table.endswith("result: PASS")
    for kind in chaos.Report.BREACHES:
        assert f"  {kind}" in table
    assert "  broker connections cut" in table and "faults injected" in table


def test_settling_waits_while_the_windows_runs_are_re_published(planted):
    """A run re-published is progress: the settling waits through its re-publishes (one a second
    here, against 4 s without progress) until it closes, instead of giving up at 4 s and
    reporting it lost after dispatch (the bounded test on the SQL broker at load 30)."""
    task, plant = planted
    _run(task, plant.first_slot, "a", status="dispatched")
    runs = Run.objects.filter(task_id="a")

    def reconcile() -> None:
        from django.db import connection

        try:
            for n in range(1, 6):
                time.sleep(1.0)
                runs.update(republished=n)
            time.sleep(1.0)
            runs.update(status="failed", reason=Run.Reason.NOT_DELIVERED)
        finally:
            connection.close()

    passes = threading.Thread(target=reconcile)
    passes.start()
    try:
        chaos.settle_window(IDENT, plant.first_slot, stall=4.0)
        status = runs.get().status
    finally:
        passes.join()
    assert (status, runs.get().republished) == ("failed", 5)
