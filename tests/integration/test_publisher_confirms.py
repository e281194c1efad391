"""Publisher confirms on RabbitMQ: a publish the broker refuses leaves its run pending.

The replica's own connection is in confirm mode on AMQP, so a ``basic.nack`` (here: a full queue
with ``x-overflow: reject-publish``, ``tests.acceptance.refusing_queue``) makes the publish raise
and the claim roll back; without confirms the message would be dropped and the run committed
dispatched all the same.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from django.conf import settings
from django.test import override_settings
from kombu import Connection

from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler
from tests.acceptance.deployment import broker_is_amqp, broker_task_ids, delete_queue
from tests.acceptance.refusing_queue import fill, refusing_queue, waiting
from tests.integration.conftest import make_due

pytestmark = [
    pytest.mark.broker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not broker_is_amqp(), reason="publisher confirms are an AMQP feature"),
]


@pytest.fixture
def refusing_app() -> Iterator[Celery]:
    """A Celery app whose default queue is a refusing queue of its own, deleted at the end."""
    name = f"q-{uuid.uuid4().hex[:10]}"
    app = Celery("refusing", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_default_queue = name
    app.conf.task_queues = [refusing_queue(name)]
    try:
        yield app
    finally:
        delete_queue(name)


@override_settings(SCHEDULING_REJECT_UNKNOWN_TASKS=False)
def test_a_refused_publish_rolls_the_claim_back_and_the_next_accepted_one_commits(
    refusing_app, make_task
):
    queue = refusing_app.conf.task_default_queue
    filler = fill(refusing_app, queue)
    run = make_due(make_task(every=3600))
    scheduler = LedgerScheduler(app=refusing_app)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("scheduling.schedulers").addHandler(handler)
    try:
        delays = [scheduler.tick() for _ in range(2)]
        refused = Run.objects.get(pk=run.pk)
        held = waiting(queue)
        with Connection(settings.CELERY_BROKER_URL) as broker:
            broker.channel().queue_purge(queue)  # the filler is gone: the queue accepts again
        scheduler.tick()
    finally:
        logging.getLogger("scheduling.schedulers").removeHandler(handler)

    assert (refused.status, refused.claimed_by, refused.dispatched_at) == (
        Run.Status.PENDING, "", None
    )
    assert held == 1  # the filler only: the refused message was not enqueued
    assert all(d > 0 for d in delays)  # backing off, as for a broker outage
    assert [r for r in records if "unavailable" in r or "again" in r] == [
        (
            f"broker unavailable, retrying with backoff: cannot publish run {run.task_id}: "
            "the broker refused the message (basic.nack)"
        ),
        "broker reachable again after 2 failed ticks",
    ]
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (Run.Status.DISPATCHED, scheduler.replica_id)
    assert broker_task_ids(queue) == [run.task_id]
    assert filler != run.task_id
