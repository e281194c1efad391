"""Misfire policies applied in the claim path, on real PostgreSQL (case C04, docs/semantics.md)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from scheduling.ledger import policy as misfire_policy
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, claim, late_task

pytestmark = pytest.mark.django_db(transaction=True)

EVERY = timedelta(seconds=30)  # late_task's default


def _claim_all(recorder) -> None:
    while [d for d in claim(recorder) if d.status != Run.Status.PENDING]:
        pass


def _ledger(task: PeriodicTask) -> list[tuple[datetime, str, int]]:
    return list(
        Run.objects.filter(periodic_task=task).order_by("scheduled_for")
        .values_list("scheduled_for", "status", "slots")
    )


def test_c04_skip_records_every_missed_slot_and_plans_the_next_future_one(make_task, recorder):
    # slots S0..S6 are more than 5 s (the task's grace) in the past; S7 is 23 s ahead
    task, s0 = late_task(make_task, TaskPolicy.Misfire.SKIP)
    _claim_all(recorder)
    claimed_by = ledger.database_now()

    assert _ledger(task) == [
        *[(s0 + k * EVERY, Run.Status.MISSED, 1) for k in range(7)],
        (s0 + 7 * EVERY, Run.Status.PENDING, 1),
    ]
    assert recorder.messages == []
    reasons = set(Run.objects.filter(status=Run.Status.MISSED).values_list("reason", flat=True))
    assert len(reasons) == 1
    late = re.fullmatch(r"misfire: skip policy, (\d+\.\d{3}) s late \(grace 5 s\)", reasons.pop())
    assert late and 187 <= float(late[1]) <= (claimed_by - s0).total_seconds()  # S0's lateness
    task.refresh_from_db()
    assert (task.total_run_count, task.last_run_at) == (0, None)


def test_catch_up_dispatches_the_most_recent_missed_slots_up_to_the_cap(make_task, recorder):
    task, s0 = late_task(make_task, TaskPolicy.Misfire.CATCH_UP, limit=3)
    _claim_all(recorder)

    assert _ledger(task) == [
        *[(s0 + k * EVERY, Run.Status.MISSED, 1) for k in range(4)],
        *[(s0 + k * EVERY, Run.Status.DISPATCHED, 1) for k in range(4, 7)],
        (s0 + 7 * EVERY, Run.Status.PENDING, 1),
    ]
    assert recorder.task_ids == [slots.task_id_for(task.pk, s0 + k * EVERY) for k in range(4, 7)]
    task.refresh_from_db()
    assert (task.total_run_count, task.last_run_at) == (3, s0 + 6 * EVERY)


def test_catch_up_under_the_cap_dispatches_every_missed_slot_in_order(make_task, recorder):
    task, s0 = late_task(make_task, TaskPolicy.Misfire.CATCH_UP, limit=100)
    _claim_all(recorder)

    assert _ledger(task) == [
        *[(s0 + k * EVERY, Run.Status.DISPATCHED, 1) for k in range(7)],
        (s0 + 7 * EVERY, Run.Status.PENDING, 1),
    ]
    assert recorder.task_ids == [slots.task_id_for(task.pk, s0 + k * EVERY) for k in range(7)]


@pytest.mark.parametrize("policy", [None, TaskPolicy.Misfire.COALESCE])
def test_c04_coalesce_dispatches_once_for_all_missed_slots(make_task, recorder, policy):
    # without a policy row the global grace applies: 187 s late is past 60 s too
    task, s0 = late_task(make_task, policy)
    _claim_all(recorder)

    assert _ledger(task) == [
        (s0, Run.Status.DISPATCHED, 7),
        (s0 + 7 * EVERY, Run.Status.PENDING, 1),
    ]
    assert Run.objects.get(scheduled_for=s0).reason == "misfire: coalesced 7 slots"
    assert recorder.task_ids == [slots.task_id_for(task.pk, s0)]


@pytest.mark.parametrize("policy", list(TaskPolicy.Misfire))
def test_c04_a_run_late_within_its_grace_is_dispatched_under_any_policy(
    make_task, recorder, policy
):
    # S0 65 s, S1 35 s, S2 5 s late, all within the 90 s grace; S3 is 25 s ahead
    task, s0 = late_task(make_task, policy, grace=90, late_by=65)
    _claim_all(recorder)

    assert _ledger(task) == [
        (s0, Run.Status.DISPATCHED, 1),
        (s0 + EVERY, Run.Status.DISPATCHED, 1),
        (s0 + 2 * EVERY, Run.Status.DISPATCHED, 1),
        (s0 + 3 * EVERY, Run.Status.PENDING, 1),
    ]
    assert Run.objects.get(scheduled_for=s0).reason == ""


def test_per_task_grace_overrides_the_global_grace(make_task, recorder):
    # 187 s late: a misfire for a 200 s grace? no. For the global 60 s: yes (coalesced)
    patient, p0 = late_task(make_task, TaskPolicy.Misfire.SKIP, grace=200)
    _claim_all(recorder)
    assert Run.objects.get(periodic_task=patient, scheduled_for=p0).status == "dispatched"


def test_skip_records_at_most_the_row_limit_and_counts_the_rest(make_task, recorder, monkeypatch):
    monkeypatch.setattr(misfire_policy, "MISSED_ROWS_LIMIT", 3)
    task, s0 = late_task(make_task, TaskPolicy.Misfire.SKIP)
    _claim_all(recorder)
    assert _ledger(task) == [
        (s0, Run.Status.MISSED, 1),
        (s0 + EVERY, Run.Status.MISSED, 1),
        (s0 + 2 * EVERY, Run.Status.MISSED, 1),
        (s0 + 3 * EVERY, Run.Status.MISSED, 4),  # stands for S3..S6
        (s0 + 7 * EVERY, Run.Status.PENDING, 1),
    ]


def test_the_policy_is_loaded_by_the_claim_query_not_per_run(make_task, recorder):
    for policy in (TaskPolicy.Misfire.SKIP, TaskPolicy.Misfire.CATCH_UP, None, None):
        late_task(make_task, policy)
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)  # as sent: the prepared claim has no text in Django's query log
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        claim(recorder)
    policy_queries = [sql for sql in sent if "scheduling_taskpolicy" in sql]
    assert len(policy_queries) == 1
    assert "FOR UPDATE" in policy_queries[0]


def test_planning_uses_the_task_grace_for_the_oldest_slot_it_plans(make_task):
    """A new task never gets a first slot older than its own grace (here 5 s, globally 60 s)."""
    now = ledger.database_now()
    start = now - timedelta(seconds=203)  # off the grid by 3 s: no boundary within the test
    strict, lenient = make_task(every=30, start_time=start), make_task(every=30, start_time=start)
    TaskPolicy.objects.create(periodic_task=strict, misfire_grace_seconds=5)
    # as if both were saved long ago (no edit floor): the grace floor decides
    PeriodicTask.objects.filter(pk__in=[strict.pk, lenient.pk]).update(date_changed=start)
    ledger.plan_missing(GRACE)
    planned = dict(Run.objects.pending().values_list("periodic_task_id", "scheduled_for"))
    k_strict = -(-(now - timedelta(seconds=5) - start) // EVERY)  # first slot >= now - 5 s
    k_lenient = -(-(now - timedelta(seconds=60) - start) // EVERY)
    assert planned == {strict.pk: start + k_strict * EVERY, lenient.pk: start + k_lenient * EVERY}


@pytest.mark.parametrize(
    ("policy", "status"),
    [
        (None, Run.Status.DISPATCHED),
        (TaskPolicy.Misfire.COALESCE, Run.Status.DISPATCHED),
        (TaskPolicy.Misfire.CATCH_UP, Run.Status.DISPATCHED),
        (TaskPolicy.Misfire.SKIP, Run.Status.MISSED),
    ],
)
def test_a_late_clocked_one_off_follows_its_misfire_policy(make_task, recorder, policy, status):
    task = make_task(clocked=ledger.database_now() - timedelta(seconds=90))  # past GRACE
    if policy is not None:
        TaskPolicy.objects.create(
            periodic_task=task, misfire_policy=policy, misfire_grace_seconds=5
        )
    ledger.reconcile(GRACE)
    _claim_all(recorder)
    [(found, reason)] = Run.objects.filter(periodic_task=task).values_list("status", "reason")
    assert found == status
    assert len(recorder.messages) == (status == Run.Status.DISPATCHED)
    # about 90 s late, whether it ran or not: the row says so (the grace is 5 s or GRACE)
    word = "caught up" if status == Run.Status.DISPATCHED else f"{policy} policy,"
    assert re.fullmatch(rf"misfire: {word} (\d+)\.\d{{3}} s late.*", reason), reason
    assert 90 <= int(re.match(r"\D*(\d+)", reason)[1]) < 150
    task.refresh_from_db()
    assert task.enabled is False


@pytest.mark.parametrize("policy", [TaskPolicy.Misfire.SKIP, TaskPolicy.Misfire.CATCH_UP])
def test_a_backlog_past_the_counting_cap_is_accounted_for_slot_by_slot(make_task, recorder, policy):
    """Every 1 s, 3 hours late (10,800 slots, past slots.MAX_COUNTED_SLOTS): no slot is lost.

    The first claim decides the backlog: the missed slots, then ``limit`` caught up. On a loaded
    machine the claims that follow can be slower than the grace, so the slots after those are a
    misfire of their own (decided the same way); the chain of rows accounts for every slot.
    """
    task, s0 = late_task(make_task, policy, limit=2, late_by=3 * 3600 + 0.5, every=1)
    _claim_all(recorder)
    rows = list(Run.objects.filter(periodic_task=task).order_by("scheduled_for"))
    one = timedelta(seconds=1)
    for row, following in zip(rows, rows[1:]):
        assert following.scheduled_for == row.scheduled_for + row.slots * one
    assert rows[-1].status == Run.Status.PENDING
    assert rows[-1].scheduled_for > ledger.database_now() - timedelta(seconds=5)
    first_kept = next(i for i, r in enumerate(rows) if r.status != Run.Status.MISSED)
    backlog = rows[:first_kept]
    assert rows[0].scheduled_for == s0 and sum(r.slots for r in backlog) >= 3 * 3600 - 10
    caught_up = [r.reason.startswith("misfire: caught up") for r in rows]
    if policy == TaskPolicy.Misfire.CATCH_UP:
        assert caught_up[first_kept:first_kept + 2] == [True, True]
    else:
        assert not any(caught_up)
    assert len(recorder.messages) == len([r for r in rows if r.status == "dispatched"])
