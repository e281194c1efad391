"""Where a replica's messages go: the task's queue, Celery's default queue, or ``task_routes``.

A replica sends each run through Celery beat's ``apply_async`` (``publisher.RunPublisher``), so
Celery's router decides as it does for stock beat. Each case reads the queues back from the
configured broker (Redis, RabbitMQ, kombu's SQL transport).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from django.conf import settings

from scheduling import ledger
from scheduling.broker_options import PUBLISH_SETTINGS
from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler
from tests.acceptance.deployment import broker_task_ids, delete_queue

pytestmark = pytest.mark.django_db(transaction=True)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def queues() -> Iterator[list[str]]:
    """Names for queues of this test, deleted from the broker at the end."""
    names: list[str] = []
    yield names
    for name in names:
        delete_queue(name)


def _app(default_queue: str, **conf: object) -> Celery:
    app = Celery(_name("routing"), broker=settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_default_queue = default_queue
    app.conf.update(conf)
    return app


def _dispatch(app: Celery, *tasks) -> dict[str, str]:
    """Tick a replica of ``app`` until each task's first run is dispatched; task ids by name."""
    scheduler = LedgerScheduler(app=app)
    try:
        for _ in range(3):
            scheduler.tick()
    finally:
        scheduler.close()
    runs = Run.objects.filter(periodic_task__in=tasks, status=Run.Status.DISPATCHED)
    return dict(runs.values_list("periodic_task_name", "task_id"))


def test_a_run_goes_to_its_tasks_queue_else_to_the_default_queue(make_task, queues, settings):
    settings.SCHEDULING_REJECT_UNKNOWN_TASKS = False
    own, default = _name("own"), _name("default")
    queues += [own, default]
    start = ledger.database_now() - timedelta(seconds=0.5)
    tasks = [
        make_task(every=3600, start_time=start, name="with-a-queue", queue=own),
        make_task(every=3600, start_time=start, name="without-one"),
        make_task(every=3600, start_time=start, name="also-without"),
    ]
    sent = _dispatch(_app(default), *tasks)

    assert broker_task_ids(own) == [sent["with-a-queue"]]
    assert sorted(broker_task_ids(default)) == sorted([sent["without-one"], sent["also-without"]])


def test_task_routes_still_decide_where_a_run_without_a_queue_goes(make_task, queues, settings):
    settings.SCHEDULING_REJECT_UNKNOWN_TASKS = False
    routed, default = _name("routed"), _name("default")
    queues += [routed, default]
    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start, name="routed", task="elsewhere.tasks.routed")
    other = make_task(every=3600, start_time=start, name="not-routed")
    app = _app(default, task_routes={"elsewhere.tasks.routed": {"queue": routed}})
    sent = _dispatch(app, task, other)

    assert broker_task_ids(routed) == [sent["routed"]]
    assert broker_task_ids(default) == [sent["not-routed"]]


def test_a_replica_keeps_the_values_of_the_celery_settings_read_at_every_publish():
    default = _name("default")
    app = _app(default, task_send_sent_event=True)
    known = [name for name in PUBLISH_SETTINGS if _has(app, name)]  # as this Celery has them
    before = {name: app.conf[name] for name in known}
    scheduler = LedgerScheduler(app=app)
    scheduler.close()

    assert {name: app.conf[name] for name in known} == before
    assert (before["task_send_sent_event"], before["task_default_queue"]) == (True, default)
    assert set(known) <= set(app.conf.changes)  # found first from now on
    # Celery 5.5 (the lowest supported) has no broker_pool_acquire_timeout nor task_repr_maxlevels
    assert {"task_always_eager", "task_send_sent_event", "task_default_queue"} <= set(known)


def _has(app: Celery, name: str) -> bool:
    try:
        app.conf[name]
    except KeyError:
        return False
    return True


def test_with_task_always_eager_a_run_still_goes_to_the_broker_and_the_replica_says_so_once(
    make_task, queues, settings, caplog
):
    default = _name("default")
    queues.append(default)
    app = _app(default, task_always_eager=True)
    ran: list[str] = []

    @app.task(name="eager.tasks.recorded", shared=False)
    def recorded() -> None:
        ran.append("inline")  # would run here, in the replica, if it were applied eagerly

    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start, name="eager", task="eager.tasks.recorded")
    scheduler = LedgerScheduler(app=app)
    try:
        with caplog.at_level(logging.WARNING, logger="scheduling.schedulers"):
            scheduler.setup_schedule()
        for _ in range(3):
            scheduler.tick()
    finally:
        scheduler.close()
    sent = Run.objects.get(periodic_task=task, status=Run.Status.DISPATCHED)

    assert broker_task_ids(default) == [sent.task_id]
    assert ran == []
    assert [r.getMessage() for r in caplog.records if r.name == "scheduling.schedulers"] == [
        "task_always_eager is on: this replica still sends every run to the broker for a worker"
        " to run, but tasks your code calls with .delay() run inline, without a worker or the"
        " ledger"
    ]
