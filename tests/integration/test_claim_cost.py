"""What makes a claim cheap, checked for its effect: a prepared claim with a generic plan, the
lean insert of the next slots, and the publish batch flushed just before the commit."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from project.celery import app
from scheduling import ledger, slots
from scheduling.exceptions import PublishFailed
from scheduling.ledger.writes import insert_pending, insert_runs, planned_run
from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler
from tests.conftest import kombu_batches_publishes
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_statements() -> list[tuple[int, int, list[str]]]:
    """(generic plans, custom plans, parameter types) of each prepared claim statement of this
    session."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, parameter_types::text[]"
            " FROM pg_prepared_statements WHERE statement LIKE %s",
            ["SELECT r.id, %FOR UPDATE OF r SKIP LOCKED"],
        )
        return cursor.fetchall()


def test_the_claim_is_prepared_once_and_runs_on_a_generic_plan(make_task, recorder):
    tasks = [make_task(every=3600, name=f"prepared-{i}") for i in range(3)]
    ledger.configure_session()  # a replica's session: generic plans (plan_cache_mode)
    for task in tasks:
        make_due(task)
        assert [d.status for d in claim(recorder)] == [Run.Status.DISPATCHED]

    # one statement, planned once: the partial indexes' predicates are literals, and only the
    # replica's due floor (ledger.DueFloor) and the batch size (psycopg sends an int as the
    # smallest type that holds it) are parameters
    assert _claim_statements() == [(3, 0, ["timestamp with time zone", "smallint"])]
    assert len(recorder.messages) == 3


def test_the_claim_is_not_prepared_when_turned_off(make_task, recorder):
    task = make_task(every=3600)
    make_due(task)
    with override_settings(SCHEDULING_PREPARED_CLAIM=False):
        assert [d.status for d in claim(recorder)] == [Run.Status.DISPATCHED]
    assert _claim_statements() == []


def test_the_lean_insert_writes_the_row_a_planned_run_model_would(make_task):
    task, other = make_task(every=60, name="same"), make_task(every=60, name="other")
    other.name = task.name  # only the task id may differ between the two rows
    slot = ledger.database_now() + timedelta(hours=1)
    insert_pending([(task, slot)], "default")
    lean = Run.objects.get(periodic_task=task, scheduled_for=slot)
    insert_runs([planned_run(other, slot)], "default")
    model = Run.objects.get(periodic_task=other, scheduled_for=slot)

    skip = {"id", "periodic_task_id", "task_id", "planned_at"}
    names = [f.attname for f in Run._meta.concrete_fields if f.attname not in skip]
    assert [getattr(lean, n) for n in names] == [getattr(model, n) for n in names]
    assert (lean.status, lean.trigger, lean.slots, lean.periodic_task_name) == (
        "pending", "schedule", 1, task.name
    )
    assert lean.task_id == slots.task_id_for(task.pk, slot)


def test_a_failed_flush_rolls_the_claim_back(make_task, recorder):
    task = make_task(every=3600)
    run = make_due(task)

    def flush() -> None:
        raise ConnectionError("broker went away")

    with pytest.raises(PublishFailed) as failed:
        ledger.claim_and_dispatch(
            recorder, replica_id="test:1", batch_size=10, grace=GRACE, flush=flush
        )
    assert str(failed.value) == f"cannot publish runs {run.task_id}: broker went away"
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.dispatched_at) == (Run.Status.PENDING, "", None)
    assert Run.objects.filter(periodic_task=task).count() == 1  # no next slot planned either


@pytest.mark.skipif(
    not settings.CELERY_BROKER_URL.startswith("redis://"), reason="Redis pipelines the batch"
)
def test_on_redis_a_claims_messages_reach_the_broker_at_the_flush(make_task):
    import redis

    queue = f"q-{uuid.uuid4().hex[:10]}"
    tasks = [make_task(every=3600, name=f"batched-{i}", queue=queue) for i in range(3)]
    for task in tasks:
        make_due(task)
    scheduler = LedgerScheduler(app=app)
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    waiting: list[int] = []
    try:
        with scheduler._publish_batch() as batch:

            def flush() -> None:
                waiting.append(client.llen(queue))
                batch.flush()
                waiting.append(client.llen(queue))

            dispatched = ledger.claim_and_dispatch(
                scheduler._publisher(), replica_id="test:1", batch_size=10, grace=GRACE, flush=flush
            )
    finally:
        client.delete(queue)
        scheduler.close()
    assert [d.status for d in dispatched] == [Run.Status.DISPATCHED] * 3
    # kombu before 5.7 cannot batch: each message is in the queue once published
    assert waiting == ([0, 3] if kombu_batches_publishes() else [3, 3])


def test_each_flush_of_a_claim_holds_twice_as_many_runs_as_the_one_before(make_task, recorder):
    tasks = [make_task(every=3600, name=f"doubling-{i}") for i in range(60)]
    for task in tasks:
        make_due(task)
    published_at_flush: list[int] = []
    ledger.claim_and_dispatch(
        recorder, replica_id="test:1", batch_size=100, grace=GRACE,
        flush=lambda: published_at_flush.append(len(recorder.messages)),
    )
    # 16, then 32 more, then the last 12: three round trips to the broker, not four.
    assert published_at_flush == [16, 48, 60]
    assert len(set(recorder.task_ids)) == 60


def test_a_replicas_claims_grow_in_a_herd_and_shrink_after_it(monkeypatch):
    from scheduling import cadences
    from scheduling.schedulers import next_batch_size

    monkeypatch.setattr(cadences, "BATCH_SIZE", 10)
    monkeypatch.setattr(cadences, "HERD_BATCH_SIZE", 35)
    sizes = [10]
    for claimed in (10, 20, 35, 35, 7):  # full, full, full, full, then not full
        sizes.append(next_batch_size(sizes[-1], claimed))
    assert sizes == [10, 20, 35, 35, 35, 10]
    monkeypatch.setattr(cadences, "HERD_BATCH_SIZE", 5)
    assert next_batch_size(10, 10) == 10  # a herd size under the batch size: claims never grow


def test_the_claim_flushes_after_16_runs_then_doubles_and_records_each_runs_flush_time(make_task, recorder):
    tasks = [make_task(every=3600, name=f"flushed-{i}") for i in range(20)]
    for task in tasks:
        make_due(task)
    published_at_flush: list[int] = []

    def flush() -> None:
        published_at_flush.append(len(recorder.messages))
        if len(published_at_flush) == 1:
            time.sleep(0.2)  # the first 16 reach the broker 0.2 s before the next message is built

    dispatched = ledger.claim_and_dispatch(
        recorder, replica_id="test:1", batch_size=100, grace=GRACE, flush=flush
    )
    assert published_at_flush == [ledger.FLUSH_EVERY, 20]
    runs = sorted(Run.objects.filter(task_id__in=recorder.task_ids), key=lambda r: r.scheduled_for)
    first = {r.dispatched_at for r in runs[: ledger.FLUSH_EVERY]}
    last = {r.dispatched_at for r in runs[ledger.FLUSH_EVERY :]}
    assert len(first) == len(last) == 1  # one flush, one time
    assert (min(last) - max(first)).total_seconds() < 0.05  # stamped when the flush returned
    assert all(d.status == Run.Status.DISPATCHED for d in dispatched)
    assert [d.lateness for d in dispatched] == [
        (r.dispatched_at - r.scheduled_for).total_seconds()
        for r in sorted(runs, key=lambda r: (r.scheduled_for, r.pk))
    ]


def test_the_ledger_has_no_index_that_another_one_already_serves():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'scheduling_run' ORDER BY 1"
        )
        names = [name for (name,) in cursor.fetchall()]
    # every index is written at each plan and dispatch: lookups by task use _recent
    assert names == [
        "scheduling_run_one_backfill_per_slot",
        "scheduling_run_one_pending_per_task",
        "scheduling_run_one_per_slot",
        "scheduling_run_overdue",  # partial: overdue runs only (the health probe, the gauge)
        "scheduling_run_overdue_watch",  # partial: the overdue pass's candidates by slot
        "scheduling_run_pending_due",
        "scheduling_run_pending_orphan",
        "scheduling_run_pkey",
        "scheduling_run_published",  # partial: dispatched runs by last publish (redelivery)
        "scheduling_run_recent",
        "scheduling_run_running",  # partial: running runs (the lost-worker sweep)
        "scheduling_run_task_id",
        "scheduling_run_unfinished",
        "scheduling_run_unique_task_id",
        "scheduling_run_waiting",  # partial: waiting runs only (the policies that buffer)
    ]
