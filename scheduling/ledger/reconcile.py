"""Reconcile: bring the pending runs in line with the periodic tasks after edits and deletions.

A pass cancels pending runs of deleted and disabled tasks, re-plans the not yet due runs whose
definition changed (``replan_edited``), plans what is missing (``planning.plan_missing``) and
closes lost executions. Safe from any number of replicas at once: rows being claimed are skipped,
and the unique constraints drop concurrent duplicates (invariant 1).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import F, OuterRef, Q, QuerySet, Subquery
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.clock import ClockTimestamp, database_now
from scheduling.exceptions import ScheduleError
from scheduling.ledger.changes import (
    SettledChanges,
    affected,
    changed_task_params,
    recent_changes,
)
from scheduling.ledger.lost import LostExecutions, close_lost_executions
from scheduling.ledger.planning import SCHEDULE_RELATED, plan_missing
from scheduling.ledger.writes import insert_pending
from scheduling.models import Run, ScheduleChange
from scheduling.sql import queries

logger = logging.getLogger(__name__)


def reconcile(
    grace: timedelta,
    using: str = "default",
    *,
    full: bool = True,
    lost: LostExecutions | None = None,
    settled: SettledChanges | None = None,
) -> int:
    """Bring the pending runs in line with the periodic tasks; return the number of runs planned.

    1. Pending runs of deleted tasks, and pending scheduled runs of disabled tasks, are cancelled.
    2. Pending scheduled runs not yet due whose task or schedule row (crontab, interval, solar,
       clocked, possibly shared by many tasks) changed are cancelled and planned again from the
       new definition, when the slot changed (see ``replan_edited``).
    3. Every enabled task without a pending scheduled run gets one (its next slot), or is disabled
       when its schedule is over (clocked time passed, expired, one-off done).
    4. With ``lost`` (the replica's memory of runs seen without their execution lock): running
       runs whose worker is gone are closed as failed, "worker lost", or left to recover, by
       their worker-loss policy (``close_lost_executions``); the scheduler then re-publishes
       ``lost.recoverable`` and the overdue dispatched runs (``delivery.redeliver``).

    With ``settled`` (the replica's memory of the change log, ``SettledChanges``) the pass leaves
    out the change-log rows it settled, and settles those it looked at for the last time once
    every step above has committed.

    ``full=False`` (the scheduler's passes after its first) looks only at what the change log
    (``ScheduleChange``: edits, creations, schedules that failed to give a slot at claim time)
    names, plus pending runs whose task was deleted: its cost follows the changes, not the number
    of tasks, and with no change it is three short indexed queries. ``full=True`` checks every
    task (at a replica's start, and as a safety net every cadences.FULL_RECONCILE_INTERVAL), as
    does a pass whose log names more than ``CHANGE_BATCH`` unsettled changes (a bulk change).

    Safe to run from any number of replicas at once: rows being claimed are skipped, and the unique
    constraints drop concurrent duplicates (invariant 1).
    """
    changed = recent_changes(using, settled)
    bulk = changed is None
    if bulk:
        full, changed = True, {}
    unplanned = changed.pop(ScheduleChange.Kind.UNPLANNED, set())
    _cancel_orphans(using, None if full else changed.get(ScheduleChange.Kind.TASK, set()))
    replan_edited(using, changed, every_task=bulk)
    if full:
        planned = plan_missing(grace, using)
    elif (changed or unplanned) and _may_be_unplanned(changed, unplanned, using):
        only = affected(changed, prefix="") | Q(id__in=sorted(unplanned))
        planned = plan_missing(grace, using, only=only)
    else:
        planned = 0
    if lost is not None:
        close_lost_executions(lost, using)
    if settled is not None:
        settled.passed()
    return planned


#: Runs one transaction of ``_cancel_orphans`` cancels, and the most transactions one pass
#: takes: a pass cancels at most 10,000 runs. The rest wait for later passes, or are cancelled
#: when claimed (``claim``: a due run of a disabled or deleted task is closed, never sent).
#: Unbounded, disabling a million tasks at once made every pass lock a million runs in one
#: transaction, past the statement timeout: each replica retried it instead of claiming.
ORPHAN_BATCH = 1000
ORPHAN_BATCHES_PER_PASS = 10


def _cancel_orphans(using: str, task_ids: set[int] | None) -> None:
    """Cancel pending runs of deleted tasks, and scheduled ones of disabled tasks, in batches.

    ``task_ids``: look for disabled tasks among these only (None: among all). At most
    ``ORPHAN_BATCHES_PER_PASS`` transactions of ``ORPHAN_BATCH`` runs each.
    """
    if task_ids is None or task_ids:  # None: among every task
        tasks = None if task_ids is None else sorted(task_ids)
        sql, params = queries["orphan_runs"], {"tasks": tasks}
    else:
        sql, params = queries["orphan_runs_of_deleted"], {}
    params.update(limit=ORPHAN_BATCH, deleted=str(Run.Reason.TASK_DELETED),
                  disabled=str(Run.Reason.TASK_DISABLED))
    cancelled = {True: 0, False: 0}  # by whether the task was deleted
    for _ in range(ORPHAN_BATCHES_PER_PASS):
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        for (deleted,) in rows:
            cancelled[deleted] += 1
        if len(rows) < ORPHAN_BATCH:
            break
    for deleted, reason in ((True, Run.Reason.TASK_DELETED), (False, Run.Reason.TASK_DISABLED)):
        if cancelled[deleted]:
            logger.info(
                "cancelled %d pending runs: %s", cancelled[deleted], reason,
                extra={"action": "cancel"},
            )


def replan_edited(
    using: str, changed: dict[str, set[int]] | None = None, *, every_task: bool = False
) -> None:
    """Re-plan the pending runs whose definition changed recently; cost follows the changes.

    The change log (``ScheduleChange``, written by database triggers on every UPDATE of a periodic
    task's scheduling columns or of a schedule row, including ``QuerySet.update()`` and raw SQL)
    names what changed in the last CHANGE_RETENTION (``changed``, by kind; read from the log when
    None, less the unplanned entries, which only ``plan_missing`` uses; ``every_task``: a bulk
    change, every task's runs). Only the pending, not yet due scheduled runs of tasks named
    there, or using a schedule row named there, are looked at, and only those planned from an
    older definition than their task's current one (``Run.definition_version`` against ``TaskVersion``, which the
    history triggers move in the editing transaction; either unknown counts as older): one query
    says whether there is one, and nothing else is read when there is none. Each gets its slot
    recomputed from the current definition: the first slot after the database clock and after
    the task's last run (``slots.initial_run`` with no grace), so an edit never fires a slot that
    is already past, even one inside the grace period. A run whose slot moved is cancelled
    ("schedule edited") and the new slot is planned in the same transaction (none when the
    schedule is over: ``plan_missing`` then disables the task). A run whose slot did not move is
    left alone, so looking at a change again (each pass within the retention) is harmless; that
    also covers an edit whose transaction committed after the run was planned from the old
    definition.
    """
    if changed is None:
        changed = recent_changes(using) or {}  # None only with a replica's memory
        changed.pop(ScheduleChange.Kind.UNPLANNED, None)
    if every_task:
        named = Q()
    elif not changed or not _planned_from_older_definition(changed, using):
        return
    else:
        named = affected(changed, prefix="periodic_task__")
    with transaction.atomic(using=using):
        now = database_now(using)
        moved, replacements = _new_slots(_edited_runs(named, using), now)
        if moved:
            Run.objects.using(using).filter(pk__in=moved).update(
                status=Run.Status.CANCELLED, reason=Run.Reason.SCHEDULE_EDITED,
                finished_at=ClockTimestamp(),
            )
        insert_pending(replacements, using)


def _edited_runs(named: Q, using: str) -> list[Run]:
    """Lock (SKIP LOCKED) the pending, not yet due scheduled runs of enabled tasks that ``named``
    selects, planned from an older definition, with their task's last slot (``last_slot``)."""
    return list(
        Run.objects.using(using)
        .pending()
        .scheduled()
        .filter(named, _STALE, periodic_task__enabled=True, due_at__gt=ClockTimestamp())
        .annotate(last_slot=Subquery(_last_slot_of_task()))
        .select_related(*SCHEDULE_RELATED, "periodic_task__scheduling_policy")
        .select_for_update(skip_locked=True, of=("self",))
    )


def _new_slots(
    edited: list[Run], now: datetime
) -> tuple[list[int], list[tuple[PeriodicTask, datetime]]]:
    """Recompute each edited run's slot at ``now`` (aware UTC): the ids of the runs whose slot
    moved, and the (task, new slot) to plan in their place."""
    moved: list[int] = []
    replacements: list[tuple[PeriodicTask, datetime]] = []
    for run in edited:
        task = run.periodic_task
        try:
            slot = slots.initial_run(task, now, last_slot=run.last_slot, grace=timedelta(0))
        except ScheduleError:
            slot = None  # plan_missing records the schedule's error
        if slot == run.scheduled_for:
            continue
        moved.append(run.pk)
        if slot is not None:
            replacements.append((task, slot))
        logger.info(
            "re-planning %s after an edit: %s -> %s",
            task.name, run.scheduled_for, slot, extra={"action": "replan"},
        )
    return moved, replacements


#: A run planned from an older definition than its task's current one, or either unknown
#: (fragment_stale_plan in queries.sql): the only runs an edit can move.
_STALE = (
    Q(definition_version__isnull=True)
    | Q(periodic_task__scheduling_version__version__isnull=True)
    | ~Q(definition_version=F("periodic_task__scheduling_version__version"))
)


def _planned_from_older_definition(changed: dict[str, set[int]], using: str) -> bool:
    """Whether a task named in ``changed`` has a pending scheduled run not yet due planned from
    an older definition than its current one (``Run.definition_version`` against
    ``TaskVersion``, or either unknown): the only runs ``replan_edited`` can move.

    One indexed query, and no Django query to build when it says no: each replica passes for
    each edit, and after the first pass (which re-planned the edit) the others find nothing.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(queries["stale_plans"], changed_task_params(changed))
        return bool(cursor.fetchone()[0])


def _may_be_unplanned(changed: dict[str, set[int]], unplanned: set[int], using: str) -> bool:
    """Whether an enabled task named in ``changed`` or in ``unplanned`` has no pending scheduled
    run: what ``plan_missing`` would look at (paused tasks included; it leaves them alone)."""
    params = changed_task_params(changed)
    params["task"] = sorted(set(params["task"]) | unplanned)
    with connections[using].cursor() as cursor:
        cursor.execute(queries["unplanned_tasks"], params)
        return bool(cursor.fetchone()[0])


def _last_slot_of_task() -> QuerySet[Run]:
    """The newest slot the row's task ran (or missed, skipped...): not pending, not cancelled."""
    return (
        Run.objects.latest_scheduled()
        .filter(periodic_task=OuterRef("periodic_task"))
        .exclude(status=Run.Status.PENDING)
        .values("scheduled_for")[:1]
    )
