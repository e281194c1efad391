"""Planning: the next slot of every enabled task without a pending run, tolerant of bad rows.

A task whose row or schedule row Django cannot load, or whose schedule cannot give a slot, gets
one failed run with the error (once per distinct error, invariant 7) and never stops the others.
Slots come from ``scheduling.slots`` (invariant 6: the schedule and the previous slot only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.clock import database_now
from scheduling.exceptions import ScheduleError
from scheduling.ledger.policy import task_grace
from scheduling.ledger.writes import failed_plan, insert_pending, insert_runs
from scheduling.models import Pause, Run

logger = logging.getLogger(__name__)

#: What planning reads with a periodic task (``select_related``, joins in the same query): its
#: schedule rows and its definition version (``TaskVersion``, written on each run it plans).
TASK_RELATED = ("interval", "crontab", "clocked", "solar", "scheduling_version")
#: The same, from a run.
SCHEDULE_RELATED = tuple(f"periodic_task__{name}" for name in TASK_RELATED)


def plan_missing(
    grace: timedelta, using: str = "default", chunk_size: int = 2000, only: Q | None = None
) -> int:
    """Plan the next slot of every enabled task that has no pending scheduled run.

    Paused tasks (an open ``Pause``) are left alone: ``ledger.resume`` plans their next slot.

    ``only`` restricts the tasks looked at (a filter on PeriodicTask), for incremental passes.

    Returns the number of runs inserted (concurrent planners' duplicates are dropped by the unique
    constraints, and not counted). A task whose schedule cannot produce a slot gets one failed run
    with the error (once per distinct error) and keeps its other runs' history.
    """
    planned = 0
    now = database_now(using)
    batch: list[tuple[PeriodicTask, datetime]] = []
    failed: list[Run] = []
    finished: list[tuple[int, str]] = []
    for task in _iterate_tasks(_unplanned_tasks(using, only), chunk_size, using):
        slot = _first_slot(task, now, grace, failed)
        if slot is None:
            continue
        if slot is _OVER:
            finished.append((task.pk, task.name))
            continue
        batch.append((task, slot))
        if len(batch) >= chunk_size:
            planned += insert_pending(batch, using)
            batch = []
    planned += insert_pending(batch, using) + insert_runs(failed, using)
    if finished:
        _disable_finished(finished, using)
    return planned


#: ``_first_slot``'s answer for a task whose schedule is over (expired, or its one run done).
_OVER = datetime.max.replace(tzinfo=UTC)


def _unplanned_tasks(using: str, only: Q | None) -> QuerySet[PeriodicTask]:
    """The enabled, unpaused tasks without a pending scheduled run, with their latest slot and
    its error (``last_slot``, ``last_error``), ordered by id."""
    pending = Run.objects.scheduled().pending().filter(periodic_task=OuterRef("pk"))
    paused = Pause.objects.open().filter(periodic_task=OuterRef("pk"))
    latest = Run.objects.latest_scheduled().filter(periodic_task=OuterRef("pk"))
    return (
        PeriodicTask.objects.using(using)
        .filter(Q(enabled=True) & (only if only is not None else Q()))
        .exclude(Exists(pending))
        .exclude(Exists(paused))
        .annotate(
            last_slot=Subquery(latest.values("scheduled_for")[:1]),
            last_error=Subquery(latest.values("error")[:1]),
        )
        .select_related(*TASK_RELATED, "scheduling_policy")
        .order_by("pk")
    )


def _first_slot(
    task: PeriodicTask | _Unloadable, now: datetime, grace: timedelta, failed: list[Run]
) -> datetime | None:
    """The slot to plan for ``task``: ``_OVER`` when its schedule is over, None when it cannot be
    planned (a failed run with the error is appended to ``failed``, once per distinct error)."""
    if isinstance(task, _Unloadable):
        if task.last_error != task.error:
            logger.error(
                "cannot load periodic task %r (id %s): %s", task.task.name, task.pk, task.error,
                extra={"action": "plan"},
            )
            failed.append(failed_plan(task.task, now, task.error))
        return None
    try:
        slot = slots.initial_run(
            task, now, last_slot=task.last_slot, grace=task_grace(task, grace)
        )
    except ScheduleError as exc:
        if task.last_error != str(exc):
            logger.error(
                "cannot plan periodic task %r: %s", task.name, exc, extra={"action": "plan"}
            )
            failed.append(failed_plan(task, now, str(exc)))
        return None
    return _OVER if slot is None else slot


def _disable_finished(finished: list[tuple[int, str]], using: str) -> None:
    """Disable the tasks ``(id, name)`` whose schedule is over, and log their names."""
    PeriodicTask.objects.using(using).filter(pk__in=[pk for pk, _ in finished]).update(
        enabled=False
    )
    names = ", ".join(repr(name) for _, name in finished[:10])
    more = f" and {len(finished) - 10} more" if len(finished) > 10 else ""
    logger.info(
        "disabled %d periodic tasks whose schedule is over (expired, or its one run done):"
        " %s%s", len(finished), names, more, extra={"action": "disable"},
    )


#: Errors Django raises while turning a bad row into a model (not database errors).
LOAD_ERRORS = (ValidationError, ValueError, TypeError, OverflowError, LookupError)


@dataclass
class _Unloadable:
    """A periodic task whose row (or schedule row) Django cannot load, with the error."""

    task: PeriodicTask
    error: str
    last_error: str

    @property
    def pk(self) -> int:
        return self.task.pk


def _iterate_tasks(
    tasks: QuerySet[PeriodicTask], chunk_size: int, using: str
) -> Iterator[PeriodicTask | _Unloadable]:
    """Iterate ``tasks`` by chunks of ids; past a row that cannot be loaded, go task by task."""
    ids = list(tasks.values_list("pk", flat=True))
    for start in range(0, len(ids), chunk_size):
        chunk = ids[start : start + chunk_size]
        try:
            loaded: list[PeriodicTask] | None = list(tasks.filter(pk__in=chunk))
        except LOAD_ERRORS:
            loaded = None
        if loaded is not None:
            yield from loaded
            continue
        for pk in chunk:
            try:
                found = tasks.filter(pk=pk).first()
            except LOAD_ERRORS as exc:
                bare = PeriodicTask.objects.using(using).only("id", "name", "task").get(pk=pk)
                last_error = (
                    Run.objects.using(using)
                    .latest_scheduled()
                    .filter(periodic_task_id=pk)
                    .values_list("error", flat=True)
                    .first()
                )
                yield _Unloadable(bare, f"cannot load the schedule: {exc}", last_error or "")
            else:
                if found is not None:
                    yield found
