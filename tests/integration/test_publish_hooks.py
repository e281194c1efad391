"""A run goes out through the scheduler's ``apply_entry`` and ``apply_async``; when either does
not send it, the run stays pending: the claim's transaction rolls back, as for a broker error.

The hooks are wrapped at class level, on ``celery.beat.Scheduler``, as sentry-sdk wraps them.
Stock ``apply_entry`` only logs a failed publish; the replica must not take that for a sent run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, beat
from django.conf import settings
from kombu.exceptions import OperationalError as KombuOperationalError

from scheduling import ledger
from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler
from tests.acceptance.deployment import broker_task_ids, delete_queue

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"hooks-{uuid.uuid4().hex[:10]}"
    yield name
    delete_queue(name)


@pytest.fixture
def replica(queue: str) -> Iterator[LedgerScheduler]:
    app = Celery(f"hooks-{uuid.uuid4().hex[:6]}", broker=settings.CELERY_BROKER_URL,
                 set_as_current=False)
    app.conf.task_default_queue = queue

    @app.task(name="hooks.plain", shared=False)
    def plain() -> None:
        """A task with no options of its own."""

    scheduler = LedgerScheduler(app=app)
    yield scheduler
    scheduler.close()


def _due(make_task) -> Any:
    start = ledger.database_now() - timedelta(seconds=0.5)
    return make_task(every=3600, start_time=start, name="hooked", task="hooks.plain")


def _wrap(monkeypatch, method: str, wrapper: Callable[..., Any]) -> list[str]:
    """Wrap ``celery.beat.Scheduler.<method>`` at class level; return the task ids it saw."""
    seen: list[str] = []
    original = getattr(beat.Scheduler, method)

    def wrapped(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(entry.options["task_id"])
        return wrapper(original, self, entry, *args, **kwargs)

    monkeypatch.setattr(beat.Scheduler, method, wrapped)
    return seen


def _ticks(replica: LedgerScheduler, n: int = 3) -> None:
    for _ in range(n):
        replica.tick()


def test_a_publish_that_fails_in_apply_async_leaves_the_run_pending(
    replica, queue, make_task, monkeypatch, caplog
):
    task = _due(make_task)
    failing = [True]

    def refuse(original, self, entry, *args, **kwargs):
        if failing[0]:
            raise KombuOperationalError("connection to the broker lost")
        return original(self, entry, *args, **kwargs)

    seen = _wrap(monkeypatch, "apply_async", refuse)
    with caplog.at_level(logging.ERROR):
        _ticks(replica)
    run = Run.objects.get(periodic_task=task)
    assert (run.status, run.dispatched_at, broker_task_ids(queue)) == (
        Run.Status.PENDING, None, []
    )
    assert seen == [run.task_id] * 3  # each tick claims it again
    assert [r.getMessage() for r in caplog.records if r.name == "scheduling.schedulers"] == [
        f"broker unavailable, retrying with backoff: cannot publish run {run.task_id}: "
        "connection to the broker lost"
    ]

    failing[0] = False
    _ticks(replica)
    run.refresh_from_db()
    assert (run.status, broker_task_ids(queue)) == (Run.Status.DISPATCHED, [run.task_id])
    assert seen == [run.task_id] * 4


def test_an_entry_that_a_wrapper_never_passes_on_is_not_dispatched(
    replica, queue, make_task, monkeypatch, caplog
):
    task = _due(make_task)
    seen = _wrap(monkeypatch, "apply_entry", lambda original, self, entry, **kw: None)
    with caplog.at_level(logging.ERROR):
        _ticks(replica)

    run = Run.objects.get(periodic_task=task)
    assert (run.status, run.dispatched_at, broker_task_ids(queue), seen) == (
        Run.Status.PENDING, None, [], [run.task_id] * 3
    )
    assert [r.getMessage() for r in caplog.records if r.name == "scheduling.schedulers"] == [
        f"broker unavailable, retrying with backoff: cannot publish run {run.task_id}: the"
        " entry of 'hooked' never reached apply_async: nothing was sent"
    ]
