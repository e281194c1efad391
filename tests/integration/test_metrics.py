"""What the claim reports to the metrics under each misfire policy, against the ledger."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY

from scheduling import metrics
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import claim, late_task

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
