"""Misfire and overlap policies as pure decisions (``scheduling.ledger.policy``): no database.

Every task here is unsaved (``tests.unit.slot_factories``), its ``TaskPolicy`` attached in memory;
what the claim does with each decision is tested against PostgreSQL in tests/integration.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling.ledger import policy
from scheduling.ledger.policy import MisfireDecision
from scheduling.models import Run, TaskPolicy
from tests.unit.slot_factories import GRACE, interval_task, utc

S0 = utc(2025, 6, 2, 12, 0, 0)


def _s(seconds: float):
    return S0 + timedelta(seconds=seconds)


def _every_10s(misfire: str | None = None, grace: int | None = 5, limit: int = 100,
               overlap: str = TaskPolicy.Overlap.ALLOW, stale: int | None = None) -> PeriodicTask:
    task = interval_task(10, start_time=S0)
    if misfire is not None:
        task.scheduling_policy = TaskPolicy(
            misfire_policy=misfire, misfire_grace_seconds=grace, catch_up_limit=limit,
            overlap_policy=overlap, overlap_stale_seconds=stale,
        )
    return task


def test_a_run_inside_its_grace_is_no_misfire():
    assert policy.misfire(_every_10s(), S0, S0 + GRACE, GRACE) is None
    assert policy.misfire(_every_10s(TaskPolicy.Misfire.SKIP), S0, _s(5), GRACE) is None


def test_coalesce_is_the_default_and_stands_for_every_slot_up_to_now():
    decision = policy.misfire(_every_10s(), S0, _s(67), GRACE)
    assert decision == MisfireDecision(
        MisfireDecision.COALESCED, "misfire: coalesced 7 slots", _s(70), slots=7
    )
    assert (decision.dispatches, decision.misfired_slots) == (True, 7)


def test_skip_records_the_run_and_the_later_slots_missed_and_plans_past_the_grace():
    decision = policy.misfire(_every_10s(TaskPolicy.Misfire.SKIP), S0, _s(67), GRACE)
    assert decision == MisfireDecision(
        MisfireDecision.MISSED,
        Run.Reason.missed("skip", timedelta(seconds=67), timedelta(seconds=5)),
        _s(70),
        missed=(_s(10), _s(20), _s(30), _s(40), _s(50), _s(60)),
    )
    assert decision.reason == "misfire: skip policy, 67.000 s late (grace 5 s)"
    assert (decision.dispatches, decision.misfired_slots) == (False, 7)


def test_catch_up_misses_the_older_slots_and_dispatches_the_most_recent_limit():
    task = _every_10s(TaskPolicy.Misfire.CATCH_UP, limit=3)
    first = policy.misfire(task, S0, _s(67), GRACE)
    assert (first.outcome, first.missed, first.next_slot) == (
        MisfireDecision.MISSED, (_s(10), _s(20), _s(30)), _s(40)
    )
    assert first.misfired_slots == 4
    replay = policy.misfire(task, _s(40), _s(67), GRACE)  # two missed slots after it: 2 < 3
    assert replay == MisfireDecision(
        MisfireDecision.CAUGHT_UP, "misfire: caught up 27.000 s late", _s(50)
    )
    assert replay.misfired_slots == 1


def test_past_the_row_limit_the_last_missed_row_counts_the_rest(monkeypatch):
    monkeypatch.setattr(policy, "MISSED_ROWS_LIMIT", 3)
    decision = policy.misfire(_every_10s(TaskPolicy.Misfire.SKIP), S0, _s(67), GRACE)
    assert (decision.missed, decision.last_row_slots) == ((_s(10), _s(20), _s(30)), 4)
    assert decision.misfired_slots == 7


def test_the_task_grace_overrides_the_default():
    task = _every_10s(TaskPolicy.Misfire.COALESCE, grace=120)
    assert policy.task_grace(task, GRACE) == timedelta(seconds=120)
    assert policy.misfire(task, S0, _s(119), GRACE) is None
    assert policy.task_grace(_every_10s(), GRACE) == GRACE


@pytest.mark.parametrize(
    ("misfire", "limit", "missed"),
    [
        (None, 100, False),
        (TaskPolicy.Misfire.COALESCE, 100, False),
        (TaskPolicy.Misfire.CATCH_UP, 1, False),
        (TaskPolicy.Misfire.CATCH_UP, 0, True),
        (TaskPolicy.Misfire.SKIP, 100, True),
    ],
)
def test_a_late_one_off_is_missed_only_under_a_policy_that_drops_late_runs(misfire, limit, missed):
    task = _every_10s(misfire, limit=limit)
    five = timedelta(seconds=5)  # the default grace, for the task without a policy row
    decision = policy.one_off_misfire(task, S0, _s(6), five)
    assert policy.one_off_misfire(task, S0, _s(5), five) is None  # inside its grace
    if not missed:  # dispatched, saying how late: a clocked one-off found past due
        assert decision == MisfireDecision(
            MisfireDecision.CAUGHT_UP, "misfire: caught up 6.000 s late", None
        )
        assert decision.dispatches and decision.misfired_slots == 1
        return
    assert decision == MisfireDecision(
        MisfireDecision.MISSED, f"misfire: {misfire} policy, 6.000 s late (grace 5 s)", None
    )


def _overlap(task, trigger=Run.Trigger.SCHEDULE, *, in_batch=False, since=None, now=_s(100)):
    return policy.overlap(
        task, trigger, S0, in_batch=in_batch, busy_since=since, now=now, default_stale=3600.0
    )


def test_overlap_allow_and_manual_runs_never_skip():
    skip = _every_10s(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.SKIP)
    assert _overlap(_every_10s(), in_batch=True, since=_s(90)) == ""
    assert _overlap(None, in_batch=True) == ""
    assert _overlap(skip, Run.Trigger.MANUAL, in_batch=True, since=_s(90)) == ""


def test_overlap_skip_while_an_earlier_run_is_unfinished_until_it_is_stale():
    skip = _every_10s(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.SKIP, stale=60)
    assert _overlap(skip) == ""
    assert _overlap(skip, in_batch=True) == Run.Reason.OVERLAP_IN_BATCH
    assert _overlap(skip, Run.Trigger.BACKFILL, since=_s(90)) == (
        "overlap: the run dispatched at 2025-06-02T12:01:30+00:00 is not finished"
    )
    assert _overlap(skip, since=_s(40)) == (
        "overlap: the run dispatched at 2025-06-02T12:00:40+00:00 is not finished"
    )
    assert _overlap(skip, since=_s(39)) == ""  # 61 s old, past its 60 s staleness bound
