"""The chaos run's history capture (tools.capture) on real PostgreSQL: the ledger's own
transactions, witnessed by the trigger, become the history's events, with the database clock."""

from __future__ import annotations

import pytest
from django.db import connection

from scheduling import ledger
from scheduling.models import Run
from tests.integration.conftest import claim
from tools import capture, history

pytestmark = pytest.mark.django_db(transaction=True)

IDENT = "chaos-witness"


@pytest.fixture
def witness():
    recorder = capture.Capture(IDENT)
    recorder.install()
    try:
        yield recorder
    finally:
        recorder.remove()


def _kinds(events: list[dict], run: Run) -> list[tuple[str, str]]:
    return [(e["kind"], e["process"]) for e in events if e["run"] == run.pk]


def test_each_transition_of_a_run_is_one_event_of_the_session_that_made_it(
    witness, make_task, recorder
):
    task = make_task(every=3600, name=f"{IDENT} #0 interval")
    other = make_task(every=3600, name="someone else's task")
    dispatched = ledger.request_run(task)
    ledger.request_run(other)  # not the chaos run's: no event
    claim(recorder, replica_id="replica-1")
    assert ledger.begin_execution(
        dispatched.task_id, "worker-1@host", retries=0, redelivered=False, exclusive=True
    ).execute
    assert not ledger.begin_execution(  # a re-published copy, dropped
        dispatched.task_id, "worker-2@host", retries=0, redelivered=False, exclusive=True
    ).execute
    assert ledger.record_finished(dispatched.task_id, Run.Status.SUCCEEDED, retries=0)
    adopted = ledger.request_run(task)  # its claim "rolled back": a worker takes it pending
    assert ledger.begin_execution(
        adopted.task_id, "worker-2@host", retries=0, redelivered=False, exclusive=True
    ).execute
    expired = ledger.request_run(task)
    claim(recorder, replica_id="replica-2")
    assert ledger.record_not_executed(
        expired.task_id, Run.Status.EXPIRED, Run.Reason.MESSAGE_EXPIRED
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (after,) = cursor.fetchone()

    changes = witness.changes()
    events = list(capture.events(changes))

    session = f"backend {changes[0].backend}"  # the test's session has no application_name
    assert _kinds(events, dispatched) == [
        ("planned", session),
        ("claimed", "replica-1"),
        ("published", "replica-1"),
        ("committed", "replica-1"),
        ("started", "worker-1@host"),
        ("suppressed", session),
        ("finished", session),
    ]
    assert _kinds(events, adopted) == [
        ("planned", session),
        ("adopted", "worker-2@host"),
        ("started", "worker-2@host"),
    ]
    assert _kinds(events, expired) == [
        ("planned", session),
        ("claimed", "replica-2"),
        ("published", "replica-2"),
        ("committed", "replica-2"),
        ("closed", session),
    ]
    assert {e["task"] for e in events} == {task.name}
    closed = [e for e in events if e["kind"] == "closed"]
    assert [(e["status"], e["reason"]) for e in closed] == [("expired", Run.Reason.MESSAGE_EXPIRED)]
    dispatched.refresh_from_db()
    committed = next(e for e in events if e["kind"] == "committed" and e["run"] == dispatched.pk)
    published = next(e for e in events if e["kind"] == "published" and e["run"] == dispatched.pk)
    claimed = next(e for e in events if e["kind"] == "claimed" and e["run"] == dispatched.pk)
    started = next(e for e in events if e["kind"] == "started" and e["run"] == dispatched.pk)
    # The database's clock throughout, in claim order: the claim transaction's start, its
    # publish (the ledger's dispatched_at), its last write; the guard's start after the commit.
    assert claimed["at"] <= published["at"] <= committed["at"] < started["at"]
    assert published["at"] == history.instant(dispatched.dispatched_at)
    assert started["at"] == history.instant(dispatched.started_at)
    assert max(e["at"] for e in events) <= history.instant(after)
    assert len({e["txid"] for e in events if e["run"] == dispatched.pk}) == 5  # one per step
    # The checker: runs executed by no execution log here, but each closed or finished.
    verdict = history.check(events)
    assert {k: len(v) for k, v in verdict.breaches.items() if v} == {
        "committed, never executed nor closed": 1,  # the adopted run: started, never finished
    }


def test_a_second_claim_is_seen_although_the_ledger_keeps_only_the_last(
    witness, make_task, recorder
):
    """A run put back to pending behind the claim's back (the bug the checker is there for) and
    claimed again: the row says one replica dispatched it, the history says two did."""
    task = make_task(every=3600, name=f"{IDENT} #1 interval")
    run = ledger.request_run(task)
    claim(recorder, replica_id="replica-1")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.PENDING)
    claim(recorder, replica_id="replica-2")
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, "replica-2")

    verdict = history.check(capture.events(witness.changes()))

    slot = history.instant(run.scheduled_for)
    name = f"run {run.pk} ({task.name} @ {slot}, task id {run.task_id})"
    assert verdict.breaches["slot claimed twice"] == [f"{name} claimed 2x"]
    assert verdict.breaches["slot committed twice"] == [f"{name} committed 2x"]
    (lost,) = verdict.breaches["committed, never executed nor closed"]  # no worker here
    assert lost.startswith(f"{name}: committed at ") and " by replica-1, " in lost
    assert not verdict.ok
