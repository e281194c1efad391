"""Bulk writes of the ledger: runs inserted or updated by the set, and the tasks a claim ran.

One statement per call whatever the number of rows (``scheduling.sql.compose`` builds them).
Concurrent planners' duplicates are dropped by the unique constraints (``ON CONFLICT DO
NOTHING``): a conflict is an expected outcome, not an error (invariant 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.exceptions import ScheduleError
from scheduling.models import Run, TaskPolicy, TaskVersion
from scheduling.sql import compose, queries

#: Longest error text kept on a run (characters).
ERROR_LIMIT = 2000


def due_at(task: PeriodicTask, slot: datetime) -> datetime:
    """When the scheduled run of ``task`` at ``slot`` is due: with its policy's jitter (UTC).

    Reads the policy cached by ``select_related("scheduling_policy")`` (no query then). A
    schedule that cannot give the next slot (the jitter's cap) leaves the run due at its slot;
    planning records that schedule's error.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    if policy is None or not policy.jitter_seconds:
        return slot
    try:
        return slots.due_moment(task, slot, policy.jitter_seconds)
    except ScheduleError:
        return slot


def definition_version(task: PeriodicTask) -> int | None:
    """The definition version of ``task`` to write on a run planned from it (None: unknown).

    Read from ``TaskVersion`` as loaded with the task (``planning.TASK_RELATED``: one join in the
    query that read the task, so the version and the definition come from the same snapshot);
    a task loaded without it costs one query here.
    """
    counter: TaskVersion | None = getattr(task, "scheduling_version", None)
    return None if counter is None else counter.version


def planned_run(task: PeriodicTask, slot: datetime, **fields: object) -> Run:
    """Return an unsaved pending scheduled run of ``task`` at ``slot``; ``fields`` override.

    A scheduled run is due at ``due_at`` (the task's jitter); a backfill run at its slot.
    ``task``: a ``PeriodicTask``, or a claim's ``claim_rows.ClaimedTask`` (the same attributes).
    """
    trigger = fields.get("trigger", Run.Trigger.SCHEDULE)
    values: dict[str, object] = {
        "periodic_task_id": task.pk,
        "periodic_task_name": task.name,
        "task": task.task,
        "scheduled_for": slot,
        "due_at": due_at(task, slot) if trigger == Run.Trigger.SCHEDULE else slot,
        "trigger": Run.Trigger.SCHEDULE,
        "status": Run.Status.PENDING,
        "task_id": slots.task_id_for(task.pk, slot),
        "definition_version": definition_version(task),
    }
    return Run(**{**values, **fields})


def failed_plan(task: PeriodicTask, now: datetime, error: str) -> Run:
    """Return the failed run that records why ``task``'s schedule gave no slot at ``now``."""
    return planned_run(
        task,
        now,
        due_at=now,
        status=Run.Status.FAILED,
        reason=Run.Reason.INVALID_SCHEDULE,
        error=error[:ERROR_LIMIT],
        finished_at=now,
    )


def insert_runs(runs: list[Run], using: str = "default") -> int:
    """Insert runs in one statement; rows that conflict with a concurrent planner's are dropped.

    Returns ``len(runs)``.
    """
    if runs:
        connection = connections[using]
        fields = compose.insert_fields()
        values = [compose.array([getattr(run, f.attname) for run in runs]) for f in fields]
        with connection.cursor() as cursor:
            cursor.execute(compose.insert_runs(connection), values)
    return len(runs)


def insert_pending(plans: list[tuple[PeriodicTask, datetime]], using: str = "default") -> int:
    """Insert one pending scheduled run per ``(task, slot)`` (aware UTC); conflicts are dropped.

    The planning hot path (every dispatch plans the task's next slot): six arrays (task id and
    name, Celery task, slot, due moment (``due_at``: the task's jitter, from its policy loaded
    with it), Celery task id, definition version) and the other columns' defaults as constants,
    with no model instance built per row. Returns ``len(plans)``.
    """
    if not plans:
        return 0
    connection = connections[using]
    statement, constant, varying = compose.insert_pending(connection)
    values = {
        "periodic_task_id": [task.pk for task, _ in plans],
        "periodic_task_name": [task.name for task, _ in plans],
        "task": [task.task for task, _ in plans],
        "scheduled_for": [slot for _, slot in plans],
        "due_at": [due_at(task, slot) for task, slot in plans],
        "task_id": [slots.task_id_for(task.pk, slot) for task, slot in plans],
        "definition_version": [definition_version(task) for task, _ in plans],
    }
    defaults = {"trigger": Run.Trigger.SCHEDULE, "status": Run.Status.PENDING}
    params = [defaults.get(f.attname, f.get_default()) for f in constant] + [
        compose.array(values[f.attname]) for f in varying
    ]  # in the statement's order: the constants, then the arrays
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
    return len(plans)


def update_runs(runs: Sequence[Any], names: tuple[str, ...], using: str = "default") -> None:
    """Write the fields ``names`` of ``runs`` (by primary key) in one UPDATE ... FROM unnest.

    ``runs``: ``Run`` instances, or anything with their attributes (a claim's ``ClaimedRun``).
    """
    connection = connections[using]
    statement, fields = compose.update_runs(names, connection)
    # The attributes as they are: ints, strings and aware datetimes, written as array literals
    # (Django's per-value get_db_prep_save was most of a claim's cost in Python; psycopg's
    # per-element list dumper a twentieth of it).
    values = [compose.array([getattr(run, f.attname) for run in runs]) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(statement, values)


@dataclass
class TaskUpdate:
    """What a claim (or an adoption) changes on one periodic task's row."""

    last_slot: datetime | None = None
    runs: int = 0
    disable: bool = False

    def ran(self, slot: datetime) -> None:
        """Count one dispatched run of ``slot``; ``last_slot`` keeps the newest."""
        self.runs += 1
        if self.last_slot is None or slot > self.last_slot:
            self.last_slot = slot


def update_tasks(updates: dict[int, TaskUpdate], using: str = "default") -> None:
    """Record last_run_at/total_run_count and disable finished tasks, without a schedule reload.

    Plain UPDATEs, not ``save()``: django-celery-beat's change marker is left alone, so no replica
    reloads anything, and ``date_changed`` (the interval anchor) does not move.
    """
    if not updates:
        return
    ids = sorted(updates)
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["update_tasks"],
            [
                compose.array(ids),
                compose.array([updates[i].last_slot for i in ids]),
                compose.array([updates[i].runs for i in ids]),
                compose.array([updates[i].disable for i in ids]),
            ],
        )
