"""What a replica publishes is what stock Celery beat publishes for the same periodic task.

Each case makes one periodic task due and lets a ``LedgerScheduler`` tick publish its run on the
configured broker (Redis, RabbitMQ, kombu's SQL transport); then stock beat sends the same
periodic task: django-celery-beat's ``ModelEntry`` of it through ``celery.beat.Scheduler``'s own
``apply_async``, on the installed Celery (5.7 adds ``celery_beat_task``). Both messages are read
back; their headers, properties, body, exchange and routing key must be equal, field by field,
but for the task id, times (an expiry, Celery's ETA) and the ledger's own headers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, beat
from django.conf import settings
from django_celery_beat.schedulers import ModelEntry
from kombu import Connection, Exchange, Queue

from scheduling import ledger
from scheduling.models import Run
from scheduling.run_message import HEADER_RUN, HEADER_SCHEDULED_FOR
from scheduling.schedulers import LedgerScheduler
from tests.acceptance.deployment import delete_queue

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]  # SQL transport: tables

#: Fields that name the run (its task id) or a time, and the ledger's own headers.
RUN_FIELDS = {
    "headers.id", "headers.root_id", "properties.correlation_id", "headers.expires",
    "headers.eta", "expiration", "body.id", "body.expires", f"headers.{HEADER_RUN}",
    f"headers.{HEADER_SCHEDULED_FOR}",
}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def queue() -> Iterator[str]:
    """A queue name of this test, its queue deleted from the broker at the end."""
    name = _name("published")
    yield name
    delete_queue(name)


def _app(queue: str, **conf: Any) -> Celery:
    app = Celery(_name("publisher"), broker=settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.update(conf)

    @app.task(name="cases.plain", shared=False)
    def plain(*args: Any, **kwargs: Any) -> None:
        """A task with no options of its own."""

    @app.task(
        name="cases.typed", shared=False, time_limit=30, soft_time_limit=20, expires=600,
        ignore_result=True,
    )
    def typed(*args: Any, **kwargs: Any) -> None:
        """A task whose decorator sets execution options (limits, an expiry, no result)."""

    return app


def _read(queue: str) -> dict[str, Any]:
    """The one message waiting in ``queue``, taken off it, as a worker would see it."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        got = Queue(queue).bind(conn.default_channel).get(no_ack=True, accept={"json", "pickle"})
        assert got is not None, f"no message in {queue}"
        properties = {  # the transports' own: a tag, a row id; on AMQP the headers again
            k: v for k, v in got.properties.items()
            if k not in ("delivery_tag", "application_headers", "sqlpoll_row")
        }
        info = got.delivery_info
        return {
            "headers": got.headers,
            "properties": properties,
            "expiration": properties.pop("expiration", None),
            "body": got.decode(),
            "content_type": got.content_type,
            "route": (info.get("exchange"), info.get("routing_key")),
        }


def _compare(app: Celery, where: str, make_task, **fields: Any) -> tuple[dict, dict, Run]:
    """Publish one run of a new periodic task through a replica, then the task as stock beat
    sends it, both read from queue ``where``; return (ours, stock's, the run) once they differ
    only in ``RUN_FIELDS``."""
    start = ledger.database_now() - timedelta(seconds=0.5)
    task = make_task(every=3600, start_time=start, **fields)
    replica = LedgerScheduler(app=app)
    try:
        for _ in range(3):
            replica.tick()
    finally:
        replica.close()
    run = Run.objects.get(periodic_task=task, status=Run.Status.DISPATCHED)
    ours = _read(where)
    task.refresh_from_db()
    with app.connection_for_write() as conn:
        beat.Scheduler(app=app, lazy=True).apply_async(
            ModelEntry(task, app=app), producer=conn.Producer(), advance=False
        )
    stock = _read(where)
    assert {k: v for k, v in _differences(stock, ours).items() if k not in RUN_FIELDS} == {}
    return ours, stock, run


def _differences(expected: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """``{"part.key": (expected, got)}`` for what differs, headers and properties key by key."""
    found = {}
    for part in expected.keys() | got.keys():
        want, have = expected.get(part), got.get(part)
        if isinstance(want, dict) and isinstance(have, dict):
            for key in want.keys() | have.keys():
                if want.get(key, "<absent>") != have.get(key, "<absent>"):
                    found[f"{part}.{key}"] = (want.get(key, "<absent>"), have.get(key, "<absent>"))
        elif want != have:
            found[part] = (want, have)
    return found


def _beat_header(stock: dict[str, Any]) -> Any:
    return stock["headers"].get("celery_beat_task", "<absent>")


def test_a_runs_message_is_stock_beats_for_a_task_without_options(queue, make_task):
    ours, stock, run = _compare(
        _app(queue), queue, make_task, task="cases.plain", args="[1, \"two\"]",
        kwargs='{"three": 3}',
    )

    assert ours["headers"]["task"] == "cases.plain"
    assert ours["body"][:2] == [[1, "two"], {"three": 3}]
    assert (ours["headers"]["id"], ours["headers"]["root_id"]) == (run.task_id, run.task_id)
    assert ours["properties"]["correlation_id"] == run.task_id
    assert ours["headers"]["periodic_task_name"] == run.periodic_task_name
    assert ours["headers"][HEADER_SCHEDULED_FOR] == run.scheduled_for.isoformat()
    assert ours["headers"][HEADER_RUN] == run.pk
    assert stock["headers"]["id"] != run.task_id
    # Celery 5.7's beat marks what beat sends; earlier Celery sends no such header
    assert _beat_header(ours) == _beat_header(stock)


def test_the_periodic_tasks_queue_priority_and_headers_are_kept(queue, make_task):
    ours, _, _ = _compare(
        _app(_name("default")), queue, make_task, task="cases.plain", queue=queue, priority=7,
        headers='{"tenant": "a"}',
    )

    assert ours["headers"]["tenant"] == "a"
    assert ours["properties"]["priority"] == 7


def test_an_exchange_and_routing_key_of_the_periodic_task_route_the_message(queue, make_task):
    exchange, key = _name("exchange"), _name("key")
    app = _app(queue, task_queues=[Queue(queue, Exchange(exchange, type="direct"), routing_key=key)])
    ours, _, _ = _compare(
        app, queue, make_task, task="cases.plain", exchange=exchange, routing_key=key
    )

    assert ours["route"] == (exchange, key)


def test_an_expiry_is_sent_as_beat_sends_it(queue, make_task):
    ours, stock, _ = _compare(_app(queue), queue, make_task, task="cases.plain", expire_seconds=90)

    assert (ours["expiration"] is None, stock["expiration"] is None) == (False, False)
    assert abs(float(ours["expiration"]) - float(stock["expiration"])) < 2_000  # milliseconds


def test_the_tasks_own_execution_options_apply_under_the_periodic_tasks(queue, make_task):
    ours, _, _ = _compare(_app(queue), queue, make_task, task="cases.typed", args="[5]")

    assert ours["headers"]["timelimit"] == [30, 20]
    assert ours["headers"]["ignore_result"] is True


def test_a_task_name_this_app_does_not_know_is_sent_as_send_task_sends_it(
    queue, make_task, settings
):
    settings.SCHEDULING_REJECT_UNKNOWN_TASKS = False
    ours, _, _ = _compare(
        _app(queue, task_send_sent_event=True), queue, make_task, task="elsewhere.tasks.unknown",
        args="[1]", kwargs='{"a": null}',
    )

    assert ours["headers"]["task"] == "elsewhere.tasks.unknown"


def test_task_protocol_1_sends_the_run_as_stock_beat_does(queue, make_task):
    ours, _, run = _compare(
        _app(queue, task_protocol=1), queue, make_task, task="cases.plain", args="[2]"
    )

    assert (ours["body"]["task"], ours["body"]["id"]) == ("cases.plain", run.task_id)
