"""Build the Celery message of a run from its periodic task row.

Kept apart from ``ledger`` (transactions) and ``schedulers`` (publishing) so that bad input is
turned into a RunRejected with a clear reason in exactly one place.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django_celery_beat.models import PeriodicTask

from scheduling.exceptions import RunRejected

#: Message headers every run carries; the worker side finds its run by them.
HEADER_RUN = "scheduling_run"
HEADER_TASK_NAME = "periodic_task_name"
HEADER_SCHEDULED_FOR = "scheduled_for"


@dataclass
class Message:
    """What to publish for one run: ``app.send_task(name, args, kwargs, **options)``.

    ``definition`` is equal for two runs whose messages differ only in their ``task_id``,
    ``headers`` and ``expires`` options: the publisher keeps the rest of the work once per
    definition (``publisher.RunPublisher``).
    """

    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    definition: Hashable = None


def build_message(run: Any, task: PeriodicTask, now: datetime | None = None) -> Message:
    """Return the message for ``run`` of ``task`` (a ``scheduling.models.Run``).

    The options carry the run's deterministic ``task_id`` and the headers ``periodic_task_name``,
    ``scheduled_for`` (ISO 8601, UTC) and ``scheduling_run`` (the run's id), plus the task's queue,
    exchange, routing key, priority and message expiry as django-celery-beat sends them.

    ``now`` is the database clock at the publish (aware): the task's ``expire_seconds`` then
    becomes the instant ``now + expire_seconds``. Celery would count the seconds from the
    publishing process's own clock, so a replica an hour behind would send messages that expired
    an hour ago. Without ``now`` the seconds are passed on as they are.

    Raises RunRejected when args, kwargs or headers are not valid JSON of the right shape.
    """
    args = load_json(task.args, "args")
    kwargs = load_json(task.kwargs, "kwargs")
    headers = load_json(task.headers, "headers")
    headers.update(
        {
            HEADER_RUN: run.pk,
            HEADER_TASK_NAME: task.name,
            HEADER_SCHEDULED_FOR: run.scheduled_for.astimezone(UTC).isoformat(),
        }
    )
    options: dict[str, Any] = {"task_id": run.task_id, "headers": headers}
    for option in ("queue", "exchange", "routing_key", "priority"):
        value = getattr(task, option)
        if value is not None and value != "":
            options[option] = value
    if task.expire_seconds is not None:
        options["expires"] = (
            task.expire_seconds if now is None else now + timedelta(seconds=task.expire_seconds)
        )
    elif task.expires is not None:
        options["expires"] = task.expires
    definition = (
        task.task, task.args, task.kwargs, task.queue, task.exchange, task.routing_key,
        task.priority,
    )
    return Message(
        name=task.task, args=args, kwargs=kwargs, options=options, definition=definition
    )


#: The JSON shape of each periodic task field a message is built from, and its empty value.
_SHAPES: dict[str, tuple[type, str]] = {
    "args": (list, "[]"), "kwargs": (dict, "{}"), "headers": (dict, "{}")
}


def load_json(raw: str | None, label: str) -> Any:
    """Parse a periodic task's ``args`` (a JSON list), ``kwargs`` or ``headers`` (JSON objects).

    ``label`` is the field's name; an empty value is the empty list or object. Raises RunRejected
    with the reason shown on the run (and in the admin form, which applies the same rule).
    """
    kind, empty = _SHAPES[label]
    try:
        value = json.loads(raw or empty)
    except (TypeError, ValueError) as exc:
        raise RunRejected(f"invalid {label} JSON: {exc}") from exc
    if not isinstance(value, kind):
        raise RunRejected(f"{label} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value

