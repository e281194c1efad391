"""What a replica publishes is what Celery beat would have published for the same run.

``publisher.RunPublisher`` builds each task definition's message once and sends every run as a
copy with the run's ids and headers (issue 17). Each case publishes the same run twice on the
configured broker (Redis, RabbitMQ, kombu's SQL transport): once as Celery beat does (the
registered task's ``apply_async``, else ``send_task``, with the run's options), once through the
publisher, and reads both messages back: headers, properties, body, exchange and routing key must
be equal, but for the transport's own delivery tag and an expiry's seconds counted from each
publish. Two runs of each definition go through the publisher: the second comes from the kept
template.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from kombu import Connection, Exchange, Producer, Queue

from scheduling.publisher import PUBLISH_RETRY_POLICY, RunPublisher
from scheduling.run_message import Message
from tests.acceptance.deployment import delete_queue

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]  # SQL transport: tables


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


def _message(name: str, args: list[Any], kwargs: dict[str, Any], **options: Any) -> Message:
    """A run's message as ``messages.build_message`` makes it: a fresh task id and run headers."""
    task_id = str(uuid.uuid4())
    headers = {
        "scheduling_run": uuid.uuid4().int % 10**9,
        "periodic_task_name": f"every minute: {name}",
        "scheduled_for": datetime.now(UTC).isoformat(),
        **options.pop("task_headers", {}),
    }
    definition = (name, repr(args), repr(kwargs), *sorted(options.items()))
    return Message(
        name=name, args=args, kwargs=kwargs,
        options={"task_id": task_id, "headers": headers, **options}, definition=definition,
    )


def _as_beat(app: Celery, producer: Any, message: Message) -> None:
    """Publish ``message`` the way Celery beat sends an entry (``celery.beat.Scheduler``), with
    the options the replica used to give ``send_task``."""
    options = {
        **message.options, "producer": producer, "retry": True,
        "retry_policy": PUBLISH_RETRY_POLICY, "confirm_timeout": 5.0,
    }
    task = app.tasks.get(message.name)
    if task is not None:
        task.apply_async(message.args, message.kwargs, **options)
    else:
        app.send_task(message.name, args=message.args, kwargs=message.kwargs, **options)


def _read(app: Celery, queue: str) -> dict[str, Any]:
    """The one message waiting in ``queue``, taken off it, as a worker would see it."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        got = Queue(queue).bind(conn.default_channel).get(no_ack=True, accept={"json", "pickle"})
        assert got is not None, f"no message in {queue}"
        properties = {  # the transports' own: a tag, a row id; on AMQP the headers again
            k: v for k, v in got.properties.items()
            if k not in ("delivery_tag", "application_headers", "sqlpoll_row")
        }
        expiration = properties.pop("expiration", None)  # milliseconds, a string
        info = got.delivery_info
        return {
            "headers": got.headers,
            "properties": properties,
            "expiration": None if expiration is None else float(expiration) / 1000,
            "body": got.decode(),
            "content_type": got.content_type,
            "route": (info.get("exchange"), info.get("routing_key")),
        }


def _compare(
    app: Celery, queue: str, *messages: Message, publisher: RunPublisher | None = None
) -> list[dict[str, Any]]:
    """Publish each message as beat would, then through ``publisher`` (a new RunPublisher by
    default); return ours as read back, once each equals beat's."""
    publisher = publisher or RunPublisher(app)
    pairs = []
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        for message in messages:
            _as_beat(app, producer, message)
            expected = _read(app, queue)
            publisher.publish(producer, message, reject_unknown=False, timeout=5.0)
            pairs.append((expected, _read(app, queue)))
    assert [_differences(expected, got) for expected, got in pairs] == [{}] * len(pairs)
    return [got for _, got in pairs]


def _differences(expected: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """``{"part.key": (expected, got)}`` for what differs, headers and properties key by key."""
    found = {}
    for part in expected.keys() | got.keys():
        want, have = expected.get(part), got.get(part)
        if isinstance(want, dict) and isinstance(have, dict):
            for key in want.keys() | have.keys():
                if not _same(want.get(key, "<absent>"), have.get(key, "<absent>")):
                    found[f"{part}.{key}"] = (want.get(key, "<absent>"), have.get(key, "<absent>"))
        elif not _same(want, have):
            found[part] = (want, have)
    return found


def _same(want: Any, have: Any) -> bool:
    """Equal; for an expiry counted from each publish (seconds, or an ISO 8601 instant), within
    the second between the two publishes."""
    if isinstance(want, float) and isinstance(have, float):
        return abs(want - have) < 1
    if isinstance(want, str) and isinstance(have, str) and want != have:
        try:
            return abs(datetime.fromisoformat(want) - datetime.fromisoformat(have)) < timedelta(1 / 86400)
        except ValueError:
            return False
    return want == have


def test_a_runs_message_is_the_one_beat_sends_for_a_task_without_options(queue):
    app = _app(queue)
    sent = _compare(
        app, queue,
        _message("cases.plain", [1, "two"], {"three": 3}),
        _message("cases.plain", [1, "two"], {"three": 3}),
    )

    first, second = sent
    assert first["headers"]["task"] == "cases.plain"
    assert first["body"][:2] == [[1, "two"], {"three": 3}]
    assert first["headers"]["id"] != second["headers"]["id"]
    assert second["headers"]["root_id"] == second["headers"]["id"]
    assert second["properties"]["correlation_id"] == second["headers"]["id"]
    assert second["headers"]["periodic_task_name"] == "every minute: cases.plain"


def test_the_periodic_tasks_queue_priority_and_headers_are_kept(queue):
    app = _app(_name("default"))  # not the run's: the periodic task names its queue
    sent = _compare(
        app, queue,
        *[
            _message("cases.plain", [], {}, queue=queue, priority=7, task_headers={"tenant": "a"})
            for _ in range(2)
        ],
    )

    assert [m["headers"]["tenant"] for m in sent] == ["a", "a"]
    assert sent[0]["properties"]["priority"] == 7


def test_an_exchange_and_routing_key_of_the_periodic_task_route_the_message(queue):
    exchange, key = _name("exchange"), _name("key")
    app = _app(queue, task_queues=[Queue(queue, Exchange(exchange, type="direct"), routing_key=key)])
    sent = _compare(
        app, queue,
        *[_message("cases.plain", [], {}, exchange=exchange, routing_key=key) for _ in range(2)],
    )

    assert [m["route"] for m in sent] == [(exchange, key)] * 2


def test_an_expiry_is_sent_as_beat_sends_it(queue):
    app = _app(queue)
    at = datetime.now(UTC) + timedelta(seconds=90)
    sent = _compare(
        app, queue,
        _message("cases.plain", [], {}, expires=at),
        _message("cases.plain", [], {}, expires=45),
        _message("cases.plain", [], {}),
    )

    assert sent[0]["headers"]["expires"] == at.isoformat()
    assert [None if m["expiration"] is None else round(m["expiration"]) for m in sent] == [
        90, 45, None
    ]


def test_the_tasks_own_execution_options_apply_under_the_periodic_tasks(queue):
    app = _app(queue)
    sent = _compare(
        app, queue,
        _message("cases.typed", [5], {}),
        _message("cases.typed", [5], {}, expires=60),
        _message("cases.typed", [5], {}),
    )

    assert [m["headers"]["timelimit"] for m in sent] == [[30, 20]] * 3
    assert [m["headers"]["ignore_result"] for m in sent] == [True] * 3
    assert [round(m["expiration"]) for m in sent] == [600, 60, 600]


def test_task_routes_are_asked_for_every_run(queue):
    other = _name("other")
    answer = {"queue": queue}

    def route(name, args, kwargs, options, task=None, **kw):
        return dict(answer)

    app = _app(_name("default"), task_routes=[route])
    publisher = RunPublisher(app)
    try:
        sent = _compare(app, queue, _message("cases.plain", [], {}), publisher=publisher)
        answer["queue"] = other
        with app.connection_for_write() as conn:
            publisher.publish(
                conn.Producer(), _message("cases.plain", [], {}), reject_unknown=False, timeout=5
            )
        moved = _read(app, other)
    finally:
        delete_queue(other)

    assert sent[0]["route"][1] == queue
    assert (moved["headers"]["task"], moved["route"][1]) == ("cases.plain", other)


def test_a_task_name_this_app_does_not_know_is_sent_as_send_task_sends_it(queue):
    app = _app(queue, task_send_sent_event=True)
    sent = _compare(
        app, queue, *[_message("elsewhere.tasks.unknown", [1], {"a": None}) for _ in range(2)]
    )

    assert [m["headers"]["task"] for m in sent] == ["elsewhere.tasks.unknown"] * 2


def test_task_protocol_1_builds_every_runs_message(queue):
    app = _app(queue, task_protocol=1)
    sent = _compare(app, queue, *[_message("cases.plain", [2], {}) for _ in range(2)])

    assert [m["body"]["task"] for m in sent] == ["cases.plain"] * 2
    assert sent[0]["body"]["id"] != sent[1]["body"]["id"]


def test_past_templates_kept_the_cache_starts_again_and_messages_stay_the_same(
    queue, monkeypatch
):
    monkeypatch.setattr("scheduling.publisher.TEMPLATES_KEPT", 2)
    app = _app(queue)
    publisher = RunPublisher(app)
    sent = _compare(
        app, queue, *[_message("cases.plain", [i], {}) for i in range(3)], publisher=publisher
    )

    assert [m["body"][0] for m in sent] == [[0], [1], [2]]
    assert len(publisher._templates) == 1  # the third definition's, in a cache started again


def test_a_buffered_publish_to_a_declared_queue_skips_kombus_declaration_and_retry(
    queue, monkeypatch
):
    """In a batch of a transport that buffers (Redis), the first message declares the queue and
    every later one goes straight into the batch; each message is still the one beat sends."""
    app = _app(queue)
    declarations = []
    declare = Producer.maybe_declare

    def counting(self: Any, entity: Any, *args: Any, **kwargs: Any) -> Any:
        declarations.append(getattr(entity, "name", entity))
        return declare(self, entity, *args, **kwargs)

    monkeypatch.setattr(Producer, "maybe_declare", counting)
    publisher = RunPublisher(app)
    messages = [_message("cases.plain", [n], {}) for n in range(3)]
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        buffered = bool(getattr(producer, "supports_batch_publish", False))
        expected = []
        for message in messages:
            _as_beat(app, producer, message)
            expected.append(_read(app, queue))
        declarations.clear()  # beat's publishes declared the queue too: count ours only
        conn.declared_entities.clear()
        batch = getattr(producer, "batch", None)  # kombu 5.7 and later
        with batch() if batch is not None else nullcontext():
            for message in messages:
                publisher.publish(producer, message, reject_unknown=False, timeout=5.0,
                                  buffered=buffered)
        got = [_read(app, queue) for _ in messages]
    assert [_differences(want, have) for want, have in zip(expected, got)] == [{}] * 3
    assert [message["body"][0] for message in got] == [[0], [1], [2]]
    if settings.CELERY_BROKER_URL.startswith("redis") and batch is not None:
        assert buffered is True
        assert declarations == [queue]  # the first publish only
    else:  # AMQP, the SQL transport and kombu before 5.7 publish each message at once
        assert buffered is False
        assert declarations == [queue] * 3
