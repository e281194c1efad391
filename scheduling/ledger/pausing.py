"""Pause and resume a periodic task: who, when (database clock) and why; one skipped run.

A pause is a ``Pause`` row (at most one open per task, a partial unique constraint). It does not
touch the task's runs: the claim closes the first run due while the task is paused as
``skipped`` (``Run.Reason.paused``), links it to the pause and plans nothing after it, and
planning leaves paused tasks alone. ``resume`` sets that run's ``slots`` to the number of slots
that passed while paused (one row however long the pause) and plans the first slot after the
resume: a resume never fires at once, whatever the misfire policy (docs/semantics.md, "Pause").
Each pause and resume is an entry of the edit history too (kind ``pause``), written with it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import CharField, Func
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.clock import database_now
from scheduling.exceptions import PauseRejected, ScheduleError
from scheduling.ledger.planning import TASK_RELATED
from scheduling.ledger.writes import insert_pending
from scheduling.models import Pause, Run, TaskHistory, TaskVersion
from scheduling.timeformat import utc_text

logger = logging.getLogger(__name__)

#: Longest ``paused_by`` / ``resumed_by`` kept (characters).
WHO_LIMIT = 150


def pause(task: PeriodicTask, *, by: str, why: str = "", using: str = "default") -> Pause:
    """Pause ``task`` from now (the database clock); return the open ``Pause``.

    ``by`` is who paused it (an admin user name, or ``command:<OS user>``), ``why`` a free text
    kept on the pause and on the skipped run. From this commit on no replica dispatches a
    scheduled run of the task; a claim already under way may still dispatch a run that was due
    before. Manual runs and backfills are not held back: they are explicit requests.

    Raises PauseRejected when the task is already paused (the database's unique constraint
    ``scheduling_pause_one_open_per_task`` decides between concurrent pauses).
    """
    try:
        with transaction.atomic(using=using):
            made = Pause.objects.using(using).create(
                periodic_task=task,
                paused_at=database_now(using),
                paused_by=by[:WHO_LIMIT],
                why=why,
            )
            _record(task, made, TaskHistory.Operation.PAUSED, {"why": why}, using)
    except IntegrityError as exc:
        since = Pause.objects.using(using).open().filter(periodic_task=task).first()
        when = f" since {utc_text(since.paused_at)} by {since.paused_by}" if since else ""
        raise PauseRejected(f"{task.name!r} is already paused{when}") from exc
    logger.debug(  # the caller reports it (the command's line, the admin's message and log line)
        "paused %s by %s: %s", task.name, made.paused_by, why or "-",
        extra={"action": "pause"},
    )
    return made


def resume(task: PeriodicTask, *, by: str, using: str = "default") -> Pause:
    """End the open pause of ``task`` now (database clock); return it, closed.

    One transaction: the task's pending scheduled run is locked first (waiting for a claim that
    holds it, so its outcome is seen), then the pause. The run the claim closed as skipped for
    the pause (or a pending run already due, which no replica claimed meanwhile, closed so now)
    gets ``slots`` = the slots from it through the resume (``slots.slots_through``; a count past
    ``slots.MAX_COUNTED_SLOTS`` of a non-interval schedule is a lower bound) and ``finished_at``
    = the resume. Then the first slot after the resume is planned (none for a disabled task, or
    when a not yet due run is still pending: it runs at its slot). Nothing is dispatched at once.

    Raises PauseRejected when the task is not paused.
    """
    with transaction.atomic(using=using):
        pending = list(
            Run.objects.using(using).pending().scheduled().filter(periodic_task=task)
            .select_for_update(of=("self",))
        )
        current = (
            Pause.objects.using(using).open().filter(periodic_task=task)
            .select_for_update(of=("self",)).first()
        )
        if current is None:
            raise PauseRejected(f"{task.name!r} is not paused")
        now = database_now(using)
        tasks = PeriodicTask.objects.using(using)
        task = tasks.select_related(*TASK_RELATED, "scheduling_policy").get(pk=task.pk)
        skipped = Run.objects.using(using).filter(pk=current.run_id).first()
        due = [run for run in pending if run.due_at <= now]
        if skipped is None and due:
            skipped = due[0]
            skipped.status = Run.Status.SKIPPED
            skipped.reason = Run.Reason.paused(current.paused_by, current.why)
            current.run = skipped
        still_pending = [run for run in pending if run is not skipped]
        following = _close_skipped(task, skipped, now, using) if skipped is not None else None
        if skipped is None and not still_pending:
            following = _first_slot_after(task, now, using)
        if following is not None and task.enabled and not still_pending:
            insert_pending([(task, following)], using)
        current.resumed_at, current.resumed_by = now, by[:WHO_LIMIT]
        current.save(update_fields=["resumed_at", "resumed_by", "run"])
        _record(task, current, TaskHistory.Operation.RESUMED, {
            "why": current.why, "paused_at": current.paused_at.isoformat(),
            "slots_skipped": skipped.slots if skipped is not None else 0,
        }, using)
    logger.debug(  # the caller reports it (the command's line, the admin's message and log line)
        "resumed %s by %s after %.0f s paused: %d slots skipped, next slot %s",
        task.name, current.resumed_by, (now - current.paused_at).total_seconds(),
        skipped.slots if skipped is not None else 0, following,
        extra={"action": "resume"},
    )
    return current


class _CurrentUser(Func):
    """The SQL role running the statement, as the history triggers record it."""

    template = "current_user"
    output_field = CharField()


def _record(
    task: PeriodicTask, pause: Pause, operation: str, details: dict[str, Any], using: str
) -> None:
    """Write the edit history entry of a pause or resume (kind ``pause``), in the caller's
    transaction: who (the pause's ``paused_by`` or ``resumed_by``), when (the same moment),
    ``details`` as ``after``, and the task's definition version in force (not moved)."""
    resumed = operation == TaskHistory.Operation.RESUMED
    version = TaskVersion.objects.using(using).filter(periodic_task_id=task.pk).values_list(
        "version", flat=True
    ).first()
    TaskHistory.objects.using(using).create(
        periodic_task_id=task.pk, periodic_task_name=task.name, version=version or 0,
        kind=TaskHistory.Kind.PAUSE, object_id=pause.pk, operation=operation, after=details,
        changed_at=pause.resumed_at if resumed else pause.paused_at,
        actor=pause.resumed_by if resumed else pause.paused_by, role=_CurrentUser(),
    )


def _close_skipped(task: PeriodicTask, run: Run, now: datetime, using: str) -> datetime | None:
    """Count the slots ``run`` stands for up to ``now``, write it; return the first slot after."""
    try:
        later, following = slots.slots_through(task, run.scheduled_for, now)
    except ScheduleError as exc:
        logger.error(
            "cannot count the slots of %s passed while paused: %s", task.name, exc,
            extra={"action": "resume"},
        )
        later, following = 0, None
    run.slots, run.finished_at = 1 + later, now
    run.save(using=using, update_fields=["status", "reason", "slots", "finished_at"])
    return following


def _first_slot_after(task: PeriodicTask, now: datetime, using: str) -> datetime | None:
    """The first slot after ``now`` of a task with no run to account for (grace 0: none due)."""
    last = Run.objects.using(using).latest_scheduled().filter(periodic_task=task).values_list(
        "scheduled_for", flat=True
    ).first()
    try:
        return slots.initial_run(task, now, last_slot=last, grace=timedelta(0))
    except ScheduleError as exc:
        logger.error("cannot plan %s after its pause: %s", task.name, exc, extra={"action": "plan"})
        return None
