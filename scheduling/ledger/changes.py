"""The change log (``ScheduleChange``): what reconcile passes re-plan, so their cost follows edits.

Database triggers (migration 0005) write a row for every change of a periodic task's scheduling
columns or of a schedule row, however it was made; the claim and the worker-side adoption write
``unplanned`` rows for tasks left without a pending run. Reconcile passes read the log, and prune
it past ``CHANGE_RETENTION``. A replica stops looking at a row once it has settled
(``SettledChanges``), so a pass costs what changed since, not what changed in the retention.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Q

from scheduling.models import ScheduleChange
from scheduling.sql import queries

#: How long a definition change is looked at by reconcile passes (and kept): long enough for the
#: editing transaction to have committed, so a plan made from the old definition is caught.
CHANGE_RETENTION = timedelta(minutes=10)
#: The kinds of schedule row a periodic task points to (a change names the row's id).
SCHEDULE_KINDS = (
    ScheduleChange.Kind.INTERVAL, ScheduleChange.Kind.CRONTAB, ScheduleChange.Kind.SOLAR,
    ScheduleChange.Kind.CLOCKED,
)


class SettledChanges:
    """One replica's memory of the change-log rows its passes no longer need to look at.

    Why a row is looked at more than once: a claim (or a worker's adoption) that read a task's
    old definition may commit its plan after the edit's row became visible, and after the pass
    that re-planned the edit; a later pass must then re-plan that run. Such a transaction was
    open when the row was first read. So once every transaction that was open then has ended,
    one more pass sees every plan made from the old definition, and the row is settled.

    ``first_seen`` maps a row id to the database time (``clock_timestamp()``) of the pass that
    first read it; ``settling`` holds the rows this pass looks at for the last time, moved to
    ``settled`` by ``passed()`` once the whole pass has committed (a pass that raised settles
    nothing). When any session of the database hides its transaction start (another role,
    without ``pg_read_all_stats``), nothing settles and every pass looks at every row of the
    retention, as without this memory. Kept in memory by the scheduler (``LedgerScheduler``); a
    restarted replica starts afresh, which only costs it passes.
    """

    def __init__(self) -> None:
        self.first_seen: dict[int, datetime] = {}
        self.settling: set[int] = set()
        self.settled: set[int] = set()

    def unsettled(self, rows: list[tuple[int, str, int]], using: str) -> list[tuple[int, str, int]]:
        """Return the ``(id, kind, object id)`` rows still to look at; note which settle now."""
        ids = {row[0] for row in rows}
        self.settled &= ids  # rows pruned from the log are forgotten
        self.first_seen = {pk: at for pk, at in self.first_seen.items() if pk in ids}
        rows = [row for row in rows if row[0] not in self.settled]
        if not rows:
            self.settling = set()
            return rows
        with connections[using].cursor() as cursor:
            cursor.execute(queries["transaction_horizon"])
            now, horizon, hidden = cursor.fetchone()
        self.settling = {
            pk for pk, _, _ in rows
            if pk in self.first_seen and not hidden
            and (horizon is None or self.first_seen[pk] < horizon)
        }
        for pk, _, _ in rows:
            self.first_seen.setdefault(pk, now)
        return rows

    def passed(self) -> None:
        """The pass committed: the rows it looked at for the last time are settled."""
        self.settled |= self.settling
        self.settling = set()


def recent_changes(
    using: str = "default", settled: SettledChanges | None = None
) -> dict[str, set[int]]:
    """Prune the change log past CHANGE_RETENTION; return the ids it names, by kind.

    With ``settled`` (the replica's memory), the rows it settled are left out.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(queries["schedule_changes_prune"], [CHANGE_RETENTION])
        cursor.execute(queries["schedule_changes"])
        rows: list[tuple[int, str, int]] = cursor.fetchall()
    if settled is not None:
        rows = settled.unsettled(rows, using)
    changed: dict[str, set[int]] = {}
    for _, kind, object_id in rows:
        changed.setdefault(kind, set()).add(object_id)
    return changed


def changed_task_params(changed: dict[str, set[int]]) -> dict[str, list[int]]:
    """The parameters of ``stale_plans`` and ``unplanned_tasks`` (queries.sql): the ids the
    change log names, by kind (``task``, and each schedule kind), sorted."""
    kinds = (ScheduleChange.Kind.TASK, *SCHEDULE_KINDS)
    return {str(kind): sorted(changed.get(kind, ())) for kind in kinds}


def affected(changed: dict[str, set[int]], prefix: str) -> Q:
    """Tasks named in ``changed``, or using a schedule row named there (``prefix`` to the task)."""
    condition = Q()
    for kind, ids in changed.items():
        field = "id" if kind == ScheduleChange.Kind.TASK else f"{kind}_id"
        condition |= Q(**{f"{prefix}{field}__in": sorted(ids)})
    return condition


def note_unplanned(task_ids: set[int], using: str = "default") -> None:
    """Name tasks in the change log so the next reconcile pass plans them (or records why not).

    For a task left without a pending run outside an edit: its schedule failed to give the next
    slot while a run was claimed or adopted.
    """
    ScheduleChange.objects.using(using).bulk_create(
        [
            ScheduleChange(kind=ScheduleChange.Kind.UNPLANNED, object_id=pk)
            for pk in sorted(task_ids)
        ]
    )
