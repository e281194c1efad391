"""A run's message expiry is an instant on the database clock, whatever the publisher's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from celery import Celery
from django_celery_beat.models import PeriodicTask

from scheduling.run_message import build_message

#: The database clock at the publish, and the clock of a replica an hour behind it.
DATABASE_NOW = datetime(2026, 12, 1, 16, 0, 0, 250_000, tzinfo=UTC)
REPLICA_NOW = DATABASE_NOW - timedelta(hours=1)


def _run() -> SimpleNamespace:
    return SimpleNamespace(pk=7, task_id="a3c1", scheduled_for=DATABASE_NOW.replace(microsecond=0))


def _expires_header(options: dict[str, object], publisher_now: datetime) -> str:
    """The ``expires`` header Celery writes for ``options``, on a publisher whose clock says
    ``publisher_now`` (what ``send_task`` passes on to ``as_task_v2``)."""
    app = Celery("messages", set_as_current=False)
    message = app.amqp.as_task_v2(
        "a3c1", "project.tasks.record", expires=options["expires"], now=publisher_now
    )
    return message.headers["expires"]


def test_expire_seconds_count_from_the_database_clock_not_the_publishers():
    task = PeriodicTask(name="expiring", task="project.tasks.record", expire_seconds=5400)

    message = build_message(_run(), task, DATABASE_NOW)

    assert message.options["expires"] == datetime(2026, 12, 1, 17, 30, 0, 250_000, tzinfo=UTC)
    assert _expires_header(message.options, REPLICA_NOW) == "2026-12-01T17:30:00.250000+00:00"


def test_without_the_database_clock_celery_counts_from_the_publishers_clock():
    """What the claim no longer does: a replica an hour behind sends an expiry an hour early."""
    task = PeriodicTask(name="expiring", task="project.tasks.record", expire_seconds=5400)

    message = build_message(_run(), task)

    assert message.options["expires"] == 5400
    assert _expires_header(message.options, REPLICA_NOW) == "2026-12-01T16:30:00.250000+00:00"


def test_an_absolute_expiry_is_passed_on_unchanged():
    expires = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    task = PeriodicTask(name="until", task="project.tasks.record", expires=expires)

    assert build_message(_run(), task, DATABASE_NOW).options["expires"] == expires
