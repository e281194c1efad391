"""What the claim reports to the metrics under each misfire policy, against the ledger."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY

from scheduling import ledger, metrics
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import GRACE, claim, late_task, make_due, unfinished_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("metrics_served")]


def _claim_all(recorder, replica: str) -> None:
    while True:
        result = claim(recorder, replica_id=replica)
        metrics.observe_claim(result, replica, 0.004)
        if not [d for d in result if d.status != Run.Status.PENDING]:
            return


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("policy", "limit", "expected"),
    [
        # seven slots more than the 5 s grace late (docs/semantics.md; test_misfire.py)
        (TaskPolicy.Misfire.SKIP, 100, {"missed": 7}),
        (TaskPolicy.Misfire.CATCH_UP, 3, {"missed": 4, "caught_up": 3}),
        (TaskPolicy.Misfire.COALESCE, 100, {"coalesced": 7}),
    ],
)
def test_misfired_slots_dispatches_and_lateness_per_policy(
    make_task, recorder, policy, limit, expected
):
    task, _ = late_task(make_task, policy, limit=limit)
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    _claim_all(recorder, replica)
    labels = {"task": task.name, "replica": replica}

    outcomes = {
        outcome: _value("scheduling_misfired_slots_total", outcome=outcome, **labels)
        for outcome in ("missed", "coalesced", "caught_up")
    }
    assert outcomes == {"missed": 0, "coalesced": 0, "caught_up": 0, **expected}
    sent = Run.objects.filter(periodic_task=task, dispatched_at__isnull=False)
    assert _value("scheduling_runs_dispatched_total", trigger="schedule", **labels) \
        == sent.count() == len(recorder.messages)
    assert _value("scheduling_run_lateness_seconds_count", **labels) == sent.count()
    assert _value("scheduling_run_lateness_seconds_sum", **labels) == pytest.approx(
        sum(r.lateness.total_seconds() for r in sent), abs=1e-6
    )
    assert _value("scheduling_claim_seconds_sum", replica=replica) == pytest.approx(
        0.004 * _value("scheduling_claim_seconds_count", replica=replica)
    )


def test_task_label_collapses_when_configured(make_task, recorder, settings):
    settings.SCHEDULING_METRICS_TASK_LABELS = False
    task, _ = late_task(make_task, None)
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    _claim_all(recorder, replica)
    assert _value("scheduling_runs_dispatched_total", task="*", replica=replica,
                  trigger="schedule") == 1
    assert _value("scheduling_runs_dispatched_total", task=task.name, replica=replica,
                  trigger="schedule") == 0


def test_nothing_is_recorded_where_nothing_can_read_it(make_task, recorder, settings, monkeypatch):
    settings.SCHEDULING_METRICS_PORT = None
    monkeypatch.delenv("SCHEDULING_METRICS_PORT", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    task, _ = late_task(make_task, None)
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    _claim_all(recorder, replica)

    assert len(recorder.messages) == 1
    labels = {"task": task.name, "replica": replica, "trigger": "schedule"}
    assert REGISTRY.get_sample_value("scheduling_runs_dispatched_total", labels) is None
    assert REGISTRY.get_sample_value("scheduling_claim_seconds_count", {"replica": replica}) is None


@pytest.mark.parametrize(
    ("started", "replaced", "revoked"),
    [
        # the dispatched run skipped; the running one left to finish
        (TaskPolicy.ReplaceStarted.FINISH, 1, 0),
        # the dispatched run skipped; the running one revoked with terminate after the commit
        (TaskPolicy.ReplaceStarted.TERMINATE, 2, 1),
    ],
)
def test_replaced_runs_are_the_claims_dispatched_replaced(
    make_task, recorder, started, replaced, revoked
):
    """``scheduling_runs_replaced_total`` adds each claimed run's ``Dispatched.replaced``: under
    overlap policy replace, the task's runs not started (skipped) and, with terminate, its
    started runs (revoked); the new run waits behind the started one (buffered)."""
    task = make_task(every=3600)
    TaskPolicy.objects.create(
        periodic_task=task, overlap_policy=TaskPolicy.Overlap.REPLACE, replace_started=started
    )
    waiting = unfinished_run(task, Run.Status.DISPATCHED, 10.0, trigger=Run.Trigger.MANUAL)
    running = unfinished_run(task, Run.Status.RUNNING, 5.0, trigger=Run.Trigger.MANUAL,
                             guarded=True)
    due = make_due(task)
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    sent_revokes: list[list[str]] = []
    result = ledger.claim_and_dispatch(
        recorder, replica_id=replica, batch_size=100, grace=GRACE, revoke=sent_revokes.append
    )
    metrics.observe_claim(result, replica, 0.004)

    assert [(d.run_id, d.status, d.replaced) for d in result] == [
        (due.pk, Run.Status.BUFFERED, replaced)
    ]
    labels = {"task": task.name, "replica": replica}
    assert _value("scheduling_runs_replaced_total", **labels) == replaced
    assert _value("scheduling_runs_buffered_total", **labels) == 1
    assert _value("scheduling_runs_skipped_total", **labels) == 0  # the ended run is no claim's
    assert sent_revokes == ([[running.task_id]] if revoked else [])
    waiting.refresh_from_db()
    assert (waiting.status, waiting.reason) == (
        Run.Status.SKIPPED, f"replaced by the run of {due.scheduled_for.isoformat()}"
    )
    assert recorder.messages == []
