"""Publish each run through Celery beat's own hooks, as stock beat sends an entry.

A replica hands every run it publishes, once, to its scheduler's ``apply_entry(entry,
producer=...)``, which calls ``apply_async(entry, ...)``: the methods tools wrap to see what beat
sends (sentry-sdk's Crons monitors, a project's own subclass), and the path on which Celery adds
its own headers (``celery_beat_task`` from Celery 5.7). The entry is a ``celery.beat.ScheduleEntry``
with the periodic task's name, Celery task, schedule, args, kwargs and options (``run_message``);
``apply_async`` sends it with the registered task's ``apply_async``, else ``send_task``, so the
message is the one stock beat sends for the same entry, plus the run's headers and task id.

Stock ``apply_entry`` logs a failed publish and returns; a run must instead stay undispatched
(the claim rolls back). So ``LedgerScheduler.apply_async`` reports each outcome here
(``RunPublisher.sent``, ``RunPublisher.failed``) and ``publish`` raises what failed, or
PublishFailed when the entry never reached ``apply_async`` (a wrapper that swallowed it).

No SQL here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqp.exceptions import MessageNacked
from celery.beat import ScheduleEntry
from kombu.exceptions import OperationalError as KombuOperationalError

from scheduling.exceptions import PublishFailed, RunRejected
from scheduling.run_message import Message

#: Celery's publish retry policy in a replica (``task_publish_retry_policy``): one immediate
#: retry (a stale pooled connection reconnects); each attempt is bounded by
#: ``cadences.BROKER_TIMEOUT``, so a dead broker fails a claim's publish in seconds, not after
#: Celery's default three retries.
PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0,
                        "interval_max": 0}


class RunPublisher:
    """Send runs through a scheduler's ``apply_entry``: ``publish(producer, message)``.

    One per replica, built with its ``LedgerScheduler``; its ``apply_async`` calls ``sent`` or
    ``failed`` for each entry it is given.
    """

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._task_id: str | None = None  # the run being published
        self._outcome: BaseException | bool = False  # True: sent; an exception: it failed

    def publish(self, producer: Any, message: Message, *, reject_unknown: bool) -> None:
        """Send one run's message with ``scheduler.apply_entry(entry, producer=producer)``;
        return once the broker has it (its confirm, on AMQP; with a buffering producer, in a
        ``Producer.batch()``, once the batch is flushed).

        ``reject_unknown`` is ``SCHEDULING_REJECT_UNKNOWN_TASKS``: a task name the app does not
        know raises RunRejected before any hook is called; otherwise it goes out as beat sends
        it, with ``send_task``. Raises PublishFailed when the broker refused the message
        (``basic.nack``: a full queue with ``reject-publish``, say) or the entry never reached
        ``apply_async``, and the other broker errors (a lost connection, a confirm or socket
        read timed out) as kombu raised them: the claim rolls back.
        """
        app = self.scheduler.app
        if reject_unknown and message.task not in app.tasks:
            raise RunRejected(f"unknown task name {message.task!r}: not registered in this app")
        entry = ScheduleEntry(
            name=message.name, task=message.task, last_run_at=message.last_run_at,
            total_run_count=message.total_run_count, schedule=message.schedule,
            args=message.args, kwargs=message.kwargs, options=message.options, app=app,
        )
        self._task_id, self._outcome = message.options["task_id"], False
        try:
            self.scheduler.apply_entry(entry, producer=producer)
            outcome = self._outcome
        finally:
            self._task_id, self._outcome = None, False
        if outcome is True:
            return
        if outcome is False:
            raise PublishFailed(
                f"the entry of {message.name!r} never reached apply_async: nothing was sent"
            )
        with _refusal():
            raise outcome

    def sent(self, entry: ScheduleEntry) -> None:
        """Note that ``apply_async`` sent ``entry`` (called by ``LedgerScheduler.apply_async``)."""
        if self._is_current(entry):
            self._outcome = True

    def failed(self, entry: ScheduleEntry, exc: BaseException) -> None:
        """Note that ``apply_async`` failed to send ``entry``: ``exc`` is the error beat's
        ``apply_async`` wrapped in its SchedulingError (the publish's own, when there is one)."""
        if self._is_current(entry):
            self._outcome = exc.__context__ if exc.__context__ is not None else exc

    def _is_current(self, entry: ScheduleEntry) -> bool:
        return self._task_id is not None and entry.options.get("task_id") == self._task_id


@contextmanager
def _refusal() -> Iterator[None]:
    """Raise PublishFailed for a publish the broker refused (``basic.nack``: a full queue with
    ``reject-publish``, say), which kombu raises as an OperationalError with an empty message."""
    try:
        yield
    except KombuOperationalError as exc:
        if isinstance(exc.__cause__, MessageNacked):
            raise PublishFailed("the broker refused the message (basic.nack)") from exc
        raise
