"""A RabbitMQ queue that refuses publishes while it is full, for the publisher-confirm tests.

``refusing_queue(name)`` is Celery's default queue ``name`` (its direct exchange and routing key
of the same name) declared with ``x-max-length`` 1 and ``x-overflow: reject-publish``: once one
message waits in it, RabbitMQ answers every further publish with ``basic.nack`` (a publisher
without confirms never learns, and the message is dropped). Only waiting messages count, so the
queue accepts again as soon as a consumer has taken the one that waits. Beat and worker
processes must declare the queue with the same arguments, or RabbitMQ closes their channel
(PRECONDITION_FAILED): ``tests.acceptance.settings_refusing_queue`` sets it as their only queue.
"""

from __future__ import annotations

from django.conf import settings
from kombu import Connection, Exchange, Queue

ARGUMENTS = {"x-max-length": 1, "x-overflow": "reject-publish"}
FILLER_LABEL = "filler"


def refusing_queue(name: str) -> Queue:
    """Return the kombu queue ``name`` that holds at most one waiting message."""
    return Queue(name, Exchange(name, "direct"), routing_key=name, queue_arguments=ARGUMENTS)


def fill(app, name: str) -> str:
    """Declare the queue ``name`` and publish one ``project.tasks.record`` message into it.

    Returns the filler's task id. The queue is then full: publishes to it are refused until a
    worker takes the filler (which then runs with ``label="filler"``).
    """
    result = app.send_task(
        "project.tasks.record", kwargs={"label": FILLER_LABEL}, queue=refusing_queue(name)
    )
    assert waiting(name) == 1
    return result.id


def waiting(name: str) -> int:
    """Return how many messages wait in the queue ``name`` (a passive declare: nothing moves)."""
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=5) as broker:
        return broker.channel().queue_declare(name, passive=True).message_count
