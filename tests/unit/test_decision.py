"""The claim's decision on one run as a value (``scheduling.ledger.decision.decide``): no database.

Each kind (dispatch, close, miss, skip) and the next slot, with exact values; tasks are unsaved
(``tests.unit.slot_factories``), their ``TaskPolicy`` attached in memory. What the claim does
with each decision is tested against PostgreSQL in tests/integration (test_claim, test_misfire,
test_overlap, test_pause).
"""

from __future__ import annotations

from datetime import timedelta

from django_celery_beat.models import ClockedSchedule

from scheduling.ledger.decision import Decision, Kind, decide
from scheduling.ledger.policy import MisfireDecision
from scheduling.models import Pause, Run, TaskPolicy
from tests.unit.slot_factories import GRACE, clocked_task, interval_task, next_id, utc

S0 = utc(2025, 6, 2, 12, 0, 0)
STALE = 3600.0


def _s(seconds: float):
    return S0 + timedelta(seconds=seconds)


def _task(misfire: str | None = None, overlap: str = TaskPolicy.Overlap.ALLOW, limit: int = 100,
          **fields):
    task = interval_task(10, start_time=S0, **fields)
    if misfire is not None:
        task.scheduling_policy = TaskPolicy(
            misfire_policy=misfire, misfire_grace_seconds=5, catch_up_limit=100,
            overlap_policy=overlap, overlap_stale_seconds=None, buffer_limit=limit,
        )
    return task


def _decide(task, now=None, trigger=Run.Trigger.SCHEDULE, **kwargs) -> Decision:
    """Decide ``task``'s run of S0; ``now`` 1 s after it unless given."""
    return decide(
        task, trigger=trigger, slot=S0, due=None, now=now or _s(1), grace=GRACE, default_stale=STALE,
        **kwargs,
    )


def test_an_on_time_run_is_dispatched_and_its_next_slot_planned():
    assert _decide(_task()) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10), over=False
    )


def test_manual_and_backfill_runs_are_dispatched_with_nothing_planned():
    for trigger in (Run.Trigger.MANUAL, Run.Trigger.BACKFILL):
        assert _decide(_task(), trigger=trigger) == Decision(Kind.DISPATCH, Run.Status.DISPATCHED)


def test_a_late_run_is_dispatched_coalesced_with_the_slots_it_stands_for():
    late = MisfireDecision(MisfireDecision.COALESCED, "misfire: coalesced 7 slots", _s(70), 7)
    assert _decide(_task(), now=_s(67)) == Decision(  # 67 s late, past the 60 s grace
        Kind.DISPATCH, Run.Status.DISPATCHED, "misfire: coalesced 7 slots", slots=7,
        next_slot=_s(70), misfire=late,
    )


def test_runs_that_end_before_any_policy_are_closed_with_their_reason():
    assert _decide(_task(), load_error="unknown time zone 'Mars/Base'") == Decision(
        Kind.CLOSE, Run.Status.FAILED, "invalid schedule", error="unknown time zone 'Mars/Base'"
    )
    assert _decide(None) == Decision(Kind.CLOSE, Run.Status.CANCELLED, "periodic task deleted")
    assert _decide(_task(enabled=False)) == Decision(
        Kind.CLOSE, Run.Status.CANCELLED, "periodic task disabled"
    )
    assert _decide(_task(expires=S0)) == Decision(
        Kind.CLOSE, Run.Status.CANCELLED, "periodic task expired", over=True
    )


def test_a_disabled_or_expired_task_still_runs_its_manual_runs():
    assert _decide(_task(enabled=False, expires=S0), trigger=Run.Trigger.MANUAL) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED
    )


def test_a_paused_task_skips_its_run_and_plans_nothing():
    pause = Pause(paused_by="ops", why="deploy")
    assert _decide(_task(), pause=pause) == Decision(
        Kind.SKIP, Run.Status.SKIPPED, "paused by ops: deploy"
    )


def test_misfire_skip_misses_the_run_and_the_later_slots_and_plans_past_the_grace():
    decision = _decide(_task(TaskPolicy.Misfire.SKIP), now=_s(67))
    reason = "misfire: skip policy, 67.000 s late (grace 5 s)"
    assert decision == Decision(
        Kind.MISS, Run.Status.MISSED, reason, next_slot=_s(70),
        misfire=MisfireDecision(
            MisfireDecision.MISSED, reason, _s(70),
            missed=(_s(10), _s(20), _s(30), _s(40), _s(50), _s(60)),
        ),
    )


def test_overlap_skip_skips_a_run_while_the_task_is_busy_and_still_plans_the_next():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.SKIP)
    assert _decide(task, in_batch=True) == Decision(
        Kind.SKIP, Run.Status.SKIPPED,
        "overlap: an earlier run of this task was dispatched in the same batch",
        next_slot=_s(10),
    )
    assert _decide(task, busy_since=_s(-30)) == Decision(
        Kind.SKIP, Run.Status.SKIPPED,
        "overlap: the run dispatched at 2025-06-02T11:59:30+00:00 is not finished",
        next_slot=_s(10),
    )
    assert _decide(task, busy_since=_s(-3600)) == Decision(  # stale: 3,601 s > 3,600 s
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10)
    )


def test_buffer_one_buffers_the_first_run_due_while_the_task_is_busy_and_plans_the_next():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.BUFFER_ONE)
    assert _decide(task, busy_since=_s(-30)) == Decision(
        Kind.BUFFER, Run.Status.BUFFERED,
        "buffered: waited for the run dispatched at 2025-06-02T11:59:30+00:00 to finish",
        next_slot=_s(10),
    )
    assert _decide(task, in_batch=True) == Decision(
        Kind.BUFFER, Run.Status.BUFFERED,
        "buffered: waited for a run dispatched in the same batch to finish",
        next_slot=_s(10),
    )
    assert _decide(task) == Decision(  # not busy: dispatched, nothing waits
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10)
    )


def test_buffer_one_skips_a_run_due_while_another_already_waits():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.BUFFER_ONE)
    assert _decide(task, busy_since=_s(-30), waiting=True) == Decision(
        Kind.SKIP, Run.Status.SKIPPED,
        "overlap: a run already waits for the run dispatched at 2025-06-02T11:59:30+00:00",
        next_slot=_s(10),
    )
    assert _decide(task, waiting=True) == Decision(  # a waiting run, nothing busy: dispatched
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10)
    )


def test_buffer_one_follows_the_staleness_bound_and_leaves_manual_runs_alone():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.BUFFER_ONE)
    assert _decide(task, busy_since=_s(-3600), waiting=True) == Decision(  # stale: 3,601 s
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10)
    )
    assert _decide(task, trigger=Run.Trigger.MANUAL, busy_since=_s(-30)) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED
    )


def test_a_released_buffered_run_is_dispatched_without_misfire_or_planning():
    task = _task(TaskPolicy.Misfire.SKIP, overlap=TaskPolicy.Overlap.BUFFER_ONE)
    # 67 s after its slot, past the 5 s grace: no misfire, its wait was the policy's
    assert _decide(task, now=_s(67), released=True) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED, planned=True
    )
    assert _decide(task, released=True, busy_since=_s(-30)) == Decision(  # busy again
        Kind.BUFFER, Run.Status.BUFFERED,
        "buffered: waited for the run dispatched at 2025-06-02T11:59:30+00:00 to finish",
        planned=True,
    )
    assert _decide(task, released=True, pause=Pause(paused_by="ops", why="")) == Decision(
        Kind.SKIP, Run.Status.SKIPPED, "paused by ops", planned=True
    )
    assert _decide(_task(enabled=False), released=True) == Decision(
        Kind.CLOSE, Run.Status.CANCELLED, "periodic task disabled", planned=True
    )


def test_buffer_all_buffers_while_busy_or_behind_waiting_runs_up_to_its_limit():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.BUFFER_ALL, limit=3)
    busy = "buffered: waited for the run dispatched at 2025-06-02T11:59:30+00:00 to finish"
    assert _decide(task, busy_since=_s(-30), waiting=2) == Decision(
        Kind.BUFFER, Run.Status.BUFFERED, busy, next_slot=_s(10)
    )
    assert _decide(task, waiting=2) == Decision(  # nothing busy, earlier slots wait: slot order
        Kind.BUFFER, Run.Status.BUFFERED, "buffered: waited behind 2 earlier runs of this task",
        next_slot=_s(10),
    )
    assert _decide(task, busy_since=_s(-30), waiting=3) == Decision(
        Kind.SKIP, Run.Status.SKIPPED, "overlap: buffer full, 3 runs already wait (buffer all)",
        next_slot=_s(10),
    )
    assert _decide(task, released=True, waiting=3) == Decision(  # the oldest, released: runs
        Kind.DISPATCH, Run.Status.DISPATCHED, planned=True
    )
    assert _decide(task, released=True, waiting=3, in_batch=True) == Decision(
        Kind.BUFFER, Run.Status.BUFFERED,
        "buffered: waited for a run dispatched in the same batch to finish", planned=True,
    )
    assert _decide(task) == Decision(Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10))
    assert _decide(task, trigger=Run.Trigger.MANUAL, waiting=3) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED
    )


def test_replace_asks_the_claim_to_end_the_unfinished_runs_when_busy_or_a_run_waits():
    task = _task(TaskPolicy.Misfire.COALESCE, overlap=TaskPolicy.Overlap.REPLACE)
    for busy in ({"busy_since": _s(-30)}, {"in_batch": True}, {"waiting": 1}):
        assert _decide(task, **busy) == Decision(
            Kind.REPLACE, Run.Status.DISPATCHED, next_slot=_s(10)
        ), busy
    assert _decide(task) == Decision(Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10))
    assert _decide(task, busy_since=_s(-3600)) == Decision(  # stale: taken for lost
        Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=_s(10)
    )
    assert _decide(task, trigger=Run.Trigger.MANUAL, busy_since=_s(-30)) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED
    )


def test_a_missed_run_is_not_also_skipped_for_overlap():
    task = _task(TaskPolicy.Misfire.SKIP, overlap=TaskPolicy.Overlap.SKIP)
    assert _decide(task, now=_s(67), in_batch=True).kind == Kind.MISS


def test_a_one_off_ends_its_schedule_dispatched_or_missed():
    clocked = ClockedSchedule(id=next_id(), clocked_time=S0)
    on_time = clocked_task(clocked)
    assert _decide(on_time) == Decision(Kind.DISPATCH, Run.Status.DISPATCHED, over=True)
    late = MisfireDecision(MisfireDecision.CAUGHT_UP, "misfire: caught up 90.000 s late", None)
    assert _decide(on_time, now=_s(90)) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED, late.reason, over=True, misfire=late
    )
    dropped = clocked_task(clocked)
    dropped.scheduling_policy = TaskPolicy(misfire_policy=TaskPolicy.Misfire.SKIP)
    reason = "misfire: skip policy, 90.000 s late (grace 60 s)"
    assert _decide(dropped, now=_s(90)) == Decision(
        Kind.MISS, Run.Status.MISSED, reason, over=True,
        misfire=MisfireDecision(MisfireDecision.MISSED, reason, None),
    )


def test_a_schedule_with_no_next_slot_is_dispatched_and_says_why():
    broken = interval_task(0, start_time=S0)
    assert _decide(broken) == Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED,
        plan_error="interval must be positive, got 0 seconds",
    )
