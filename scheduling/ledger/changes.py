"""The change log (``ScheduleChange``): what reconcile passes re-plan, so their cost follows edits.

Database triggers (``sql/schema.sql``) write a row for every change of a periodic task's scheduling
columns or of a schedule row, however it was made; the claim and the worker-side adoption write
``unplanned`` rows for tasks left without a pending run. Reconcile passes read the log, and prune
it past ``CHANGE_RETENTION``. A replica stops looking at a row once it has settled
(``SettledChanges``), so a pass costs what changed since, not what changed in the retention.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.db.models import Q

from scheduling.models import ScheduleChange
from scheduling.sql import queries

logger = logging.getLogger(__name__)

#: How long a definition change is looked at by reconcile passes (and kept): long enough for the
#: editing transaction to have committed, so a plan made from the old definition is caught.
CHANGE_RETENTION = timedelta(minutes=10)
#: The most unsettled change-log rows a pass looks at one by one. A bulk change naming more (a
#: million tasks disabled by one UPDATE) makes the pass check every task instead, as a full pass
#: does. 100,000 tasks disabled at once: 0.9 s a pass, where the queries given the 100,000 ids
#: took 3.0 s, and every replica repeated them until the rows settled.
CHANGE_BATCH = 10_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: A change-log row as a pass reads it: (id, kind, object id, changed_at, the clock after the read).
Change = tuple[int, str, int, datetime, datetime]
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
    nothing). ``since`` (an aware UTC datetime) is the watermark: every row changed before it is
    settled, and passes no longer read it. A row's ``changed_at`` is no earlier than its
    transaction's start, so once the oldest transaction open in the database started at
    ``horizon``, every row changed before ``horizon`` is visible and no other will ever be
    written; ``since`` moves up to that, less the rows still unsettled.

    A bulk change naming more than ``CHANGE_BATCH`` unsettled rows is not looked at row by row:
    the pass checks every task instead (``recent_changes`` returns None), which covers every row
    changed before its horizon; the next such check made after every transaction open at the
    first one ended settles them all, by moving ``since``.

    When any session of the database hides its transaction start (another role, without
    ``pg_read_all_stats``), nothing settles and every pass looks at every row of the retention,
    as without this memory. Kept in memory by the scheduler (``LedgerScheduler``); a restarted
    replica starts afresh, which only costs it passes.
    """

    def __init__(self) -> None:
        self.since: datetime = EPOCH
        self.first_seen: dict[int, datetime] = {}
        self.settling: set[int] = set()
        self.settled: set[int] = set()
        #: (rows changed before, checked at) of the last pass that checked every task.
        self.checked: tuple[datetime, datetime] | None = None
        self._next: tuple[datetime, tuple[datetime, datetime] | None] | None = None

    def limit(self) -> int:
        """How many rows from ``since`` on a pass reads: enough to tell a bulk change."""
        return CHANGE_BATCH + len(self.settled) + 1

    def unsettled(self, rows: list[Change], horizon: datetime | None) -> list[Change] | None:
        """Return the rows still to look at, or None when there are more than ``CHANGE_BATCH``
        (check every task); note what settles now.

        ``rows``: the log from ``since`` on, at most ``limit()``, as ``schedule_changes``
        (queries.sql) reads it; ``horizon``: every row changed before it was among them (None:
        unknown, a session hides its transaction): the start of the oldest transaction open in
        the database before they were read.
        """
        ids = {row[0] for row in rows}
        now = max((row[4] for row in rows), default=EPOCH)  # the clock after the rows were read
        looked = [row for row in rows if row[0] not in self.settled]
        self.settling = set()
        if len(looked) > CHANGE_BATCH:
            since = self.since
            if self.checked is not None and horizon is not None and self.checked[1] < horizon:
                since = max(since, self.checked[0])
            self._next = (since, None if horizon is None else (horizon, now))
            return None
        self.settled &= ids  # rows pruned from the log, or below ``since``, are forgotten
        self.first_seen = {pk: at for pk, at in self.first_seen.items() if pk in ids}
        if horizon is not None:
            self.settling = {pk for pk, *_ in looked
                             if pk in self.first_seen and self.first_seen[pk] < horizon}
        for pk, *_ in looked:
            self.first_seen.setdefault(pk, now)
        since = self.since
        if horizon is not None:
            since = min([horizon, *(row[3] for row in looked if row[0] not in self.settling)])
        self._next = (max(self.since, since), None)
        return looked

    def passed(self) -> None:
        """The pass committed: the rows it looked at for the last time are settled."""
        self.settled |= self.settling
        self.settling = set()
        if self._next is not None:
            self.since, self.checked = self._next
            self._next = None


def recent_changes(
    using: str = "default", settled: SettledChanges | None = None
) -> dict[str, set[int]] | None:
    """Prune the change log past CHANGE_RETENTION; return the ids it names, by kind.

    With ``settled`` (the replica's memory), the rows it settled are left out, and None is
    returned when more than ``CHANGE_BATCH`` rows are left: the pass then checks every task.
    """
    since, limit = (settled.since, settled.limit()) if settled else (EPOCH, None)
    with connections[using].cursor() as cursor:
        cursor.execute(queries["schedule_changes_prune"], [CHANGE_RETENTION])
        now, oldest, hidden = cursor.fetchone()  # before the rows: all changed before are visible
        cursor.execute(queries["schedule_changes"], {"since": since, "limit": limit})
        rows: list[Change] | None = cursor.fetchall()
    if settled is not None:
        rows = settled.unsettled(rows, None if hidden else (oldest or now))
        if rows is None:
            logger.info("more than %d changes to look at: checking every task", CHANGE_BATCH,
                        extra={"action": "reconcile"})
            return None
    changed: dict[str, set[int]] = {}
    for _, kind, object_id, *_ in rows:
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
