"""The delivery deadline on real PostgreSQL: a dispatched run no worker started is re-published.

Invariant 9: the ledger finds a message lost inside the broker (its run stays ``dispatched``)
and publishes it again with the same task id, at most once per deadline and a bounded number of
times, then closes the run "not delivered". The publisher here records what was sent.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from scheduling import cadences, ledger
from scheduling.models import Run, TaskPolicy
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = timedelta(seconds=300)  # SCHEDULING_DELIVERY_TIMEOUT's default


@pytest.fixture
def dispatched(make_task, recorder) -> Run:
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    recorder.messages.clear()
    return Run.objects.get(pk=run.pk)


def age(run: Run, by: timedelta) -> None:
    """Move the run's last (re)publish ``by`` into the past."""
    now = ledger.database_now()
    Run.objects.filter(pk=run.pk, republished_at__isnull=True).update(dispatched_at=now - by)
    Run.objects.filter(pk=run.pk, republished_at__isnull=False).update(republished_at=now - by)


def state(run: Run) -> tuple[str, str, int]:
    run.refresh_from_db()
    return run.status, run.reason, run.republished


def test_a_run_not_started_within_the_deadline_is_republished_once_per_deadline(
    dispatched, recorder, caplog
):
    age(dispatched, DEADLINE - timedelta(seconds=5))
    assert ledger.redeliver(ledger.Republisher(recorder)).republished == []
    age(dispatched, DEADLINE + timedelta(seconds=1))
    done = ledger.redeliver(ledger.Republisher(recorder, replica_id="r1"))
    assert done.republished == [dispatched.task_id]
    assert recorder.task_ids == [dispatched.task_id]  # the same task id: the guard runs it once
    assert state(dispatched) == (
        Run.Status.DISPATCHED, "re-published (1 of 3): no worker started it within 300 s", 1
    )
    assert dispatched.republished_at is not None
    assert dispatched.dispatched_at < dispatched.republished_at  # lateness keeps the first
    assert [r.action for r in caplog.records if hasattr(r, "action")].count("republish") == 1
    # at most once per deadline: the next pass, right after, sends nothing
    assert ledger.redeliver(ledger.Republisher(recorder)).republished == []
    age(dispatched, DEADLINE + timedelta(seconds=1))
    ledger.redeliver(ledger.Republisher(recorder))
    assert state(dispatched)[2] == 2
    assert recorder.task_ids == [dispatched.task_id] * 2
    # Each re-publish is an event of the run, at its pass's database clock (the run's page).
    events = dispatched.events
    assert [(e["kind"], e["detail"]) for e in events] == [
        ("republished", "re-published (1 of 3): no worker started it within 300 s"),
        ("republished", "re-published (2 of 3): no worker started it within 300 s"),
    ]
    assert datetime.fromisoformat(events[1]["at"]) == dispatched.republished_at


def test_past_the_republish_limit_the_run_is_closed_not_delivered(dispatched, recorder, settings):
    settings.SCHEDULING_REPUBLISH_LIMIT = 2
    Run.objects.filter(pk=dispatched.pk).update(republished=2)
    age(dispatched, DEADLINE + timedelta(seconds=1))
    done = ledger.redeliver(ledger.Republisher(recorder))
    assert (done.closed, recorder.task_ids) == ([dispatched.task_id], [])
    assert state(dispatched) == (Run.Status.FAILED, "not delivered", 2)
    assert dispatched.error == (
        "no worker started it within 300 s of its dispatch nor of any of its 2 re-publishes"
    )
    assert dispatched.finished_at is not None


def test_the_task_policy_overrides_the_deadline(dispatched, recorder):
    TaskPolicy.objects.create(periodic_task=dispatched.periodic_task, delivery_timeout_seconds=30)
    age(dispatched, timedelta(seconds=31))
    assert ledger.redeliver(ledger.Republisher(recorder)).republished == [dispatched.task_id]
    assert state(dispatched)[1] == "re-published (1 of 3): no worker started it within 30 s"


def test_started_and_finished_runs_are_never_republished(dispatched, recorder):
    ledger.begin_execution(
        dispatched.task_id, "w1@host", retries=0, redelivered=False, exclusive=True
    )
    age(dispatched, DEADLINE * 10)
    assert ledger.redeliver(ledger.Republisher(recorder)) == ledger.Redelivered()
    ledger.record_finished(dispatched.task_id, Run.Status.SUCCEEDED, retries=0)
    assert ledger.redeliver(ledger.Republisher(recorder)) == ledger.Redelivered()
    assert recorder.task_ids == []


def test_one_pass_republishes_at_most_its_batch_oldest_first(make_task, recorder):
    runs = [ledger.request_run(make_task(every=3600)) for _ in range(3)]
    claim(recorder)
    recorder.messages.clear()
    for minutes, run in zip((30, 20, 10), runs, strict=True):
        age(run, DEADLINE + timedelta(minutes=minutes))
    done = ledger.redeliver(ledger.Republisher(recorder), batch_size=2)
    assert done.republished == [runs[0].task_id, runs[1].task_id]
    assert ledger.redeliver(ledger.Republisher(recorder), batch_size=2).republished == [
        runs[2].task_id
    ]


def test_a_slow_broker_ends_the_pass_before_the_idle_in_transaction_bound(
    monkeypatch,
    make_task, recorder, settings
):
    """A pass that outlived cadences.IDLE_IN_TRANSACTION_TIMEOUT would be rolled back by the
    server behind messages already sent, and the next pass would send them again (20 copies of a
    run were seen on the SQL broker). Publishing stops at half the bound; what is left is not
    written and goes in the next pass: each run is sent once."""
    import time

    monkeypatch.setattr(cadences, "IDLE_IN_TRANSACTION_TIMEOUT", 0.6)  # a budget of 0.3 s
    runs = [ledger.request_run(make_task(every=3600)) for _ in range(5)]
    claim(recorder)
    recorder.messages.clear()
    for minutes, run in zip((50, 40, 30, 20, 10), runs, strict=True):
        age(run, DEADLINE + timedelta(minutes=minutes))

    def slow(message) -> None:
        time.sleep(0.2)
        recorder(message)

    done = ledger.redeliver(ledger.Republisher(slow))
    assert (done.republished, done.deferred) == ([r.task_id for r in runs[:2]], 3)
    assert [state(run)[2] for run in runs] == [1, 1, 0, 0, 0]
    assert state(runs[2])[1] == ""  # left as it was
    while done.republished:
        done = ledger.redeliver(ledger.Republisher(slow))
    assert recorder.task_ids == [run.task_id for run in runs]  # each sent once
    assert [state(run)[2] for run in runs] == [1] * 5


def test_a_run_of_a_deleted_task_is_closed_with_the_error(dispatched, recorder):
    dispatched.periodic_task.delete()
    age(dispatched, DEADLINE + timedelta(seconds=1))
    assert ledger.redeliver(ledger.Republisher(recorder)).closed == [dispatched.task_id]
    assert state(dispatched) == (Run.Status.FAILED, "rejected before dispatch", 0)
    assert dispatched.error == "its periodic task was deleted: the message cannot be rebuilt"


def test_a_replicas_reconcile_pass_republishes_to_the_broker_and_counts_it(
    make_task, recorder, metrics_served
):
    from prometheus_client import REGISTRY

    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    task = make_task(every=3600, name="lost-in-the-broker", queue=f"q-{uuid.uuid4().hex[:10]}")
    run = ledger.request_run(task)
    claim(recorder)
    age(run, DEADLINE + timedelta(seconds=1))
    labels = {"task": task.name, "replica": "test-replica", "cause": "deadline"}
    before = REGISTRY.get_sample_value("scheduling_runs_republished_total", labels) or 0.0
    scheduler = LedgerScheduler(app=app)
    scheduler.replica_id = "test-replica"
    try:
        scheduler.tick()  # the first tick reconciles: the sweep, then the redelivery
    finally:
        scheduler.close()
    assert state(run) == (
        Run.Status.DISPATCHED, "re-published (1 of 3): no worker started it within 300 s", 1
    )
    assert REGISTRY.get_sample_value("scheduling_runs_republished_total", labels) == before + 1


def test_an_expired_message_is_not_republished_and_a_live_one_keeps_its_expiry(
    make_task, recorder
):
    expiring = make_task(every=3600, name="expires-in-400s", expire_seconds=400)
    gone = make_task(every=3600, name="expires-in-100s", expire_seconds=100)
    runs = [ledger.request_run(expiring), ledger.request_run(gone)]
    claim(recorder)
    recorder.messages.clear()
    for run in runs:
        age(run, DEADLINE + timedelta(seconds=1))
    done = ledger.redeliver(ledger.Republisher(recorder))
    assert (done.republished, done.closed) == ([runs[0].task_id], [runs[1].task_id])
    first = Run.objects.get(pk=runs[0].pk)
    assert recorder.messages[0].options["expires"] == first.dispatched_at + timedelta(seconds=400)
    assert state(runs[1]) == (Run.Status.EXPIRED, "message expired before a worker took it", 0)
    assert runs[1].error.startswith("its message expired at ")
