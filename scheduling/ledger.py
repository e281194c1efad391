"""The run ledger's transactions: poll, plan, claim-and-dispatch, record outcomes.

This is the only module that opens transactions or locks rows. The claim is a row lock taken with
``SELECT ... FOR UPDATE SKIP LOCKED`` inside the dispatch transaction, so it lives exactly as long
as that transaction: commit, rollback, or the connection dying all end it. What is due is decided
by the database clock (``clock_timestamp()``), never a replica's own clock.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import connections, transaction
from django.db.models import (
    Case,
    DateTimeField,
    Exists,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
    Window,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber
from django.db.models.query import get_related_populators
from django_celery_beat.models import PeriodicTask
from psycopg import sql

from scheduling import slots
from scheduling.conf import conf
from scheduling.exceptions import BackfillRejected, PublishFailed, RunRejected, ScheduleError
from scheduling.messages import Message, build_message
from scheduling.models import Run, ScheduleChange, TaskPolicy

logger = logging.getLogger(__name__)

Publish = Callable[[Message], None]
_SCHEDULE_RELATED = (
    "periodic_task__interval",
    "periodic_task__crontab",
    "periodic_task__clocked",
    "periodic_task__solar",
)
_TASK_RELATED = ("interval", "crontab", "clocked", "solar")
_ERROR_LIMIT = 2000
#: Most missed slots recorded as rows of their own by one misfire; past it the last row's
#: ``slots`` counts the rest.
MISSED_ROWS_LIMIT = 1000
#: Published runs a claim lets a buffering publisher hold before it flushes: one Redis round trip
#: per this many messages, and no message waits for the whole batch to be built.
FLUSH_EVERY = 16
#: Most slots one missed row stands for (``Run.slots`` is a PostgreSQL integer).
_SLOTS_COLUMN_MAX = 2**31 - 1
#: How long a definition change is looked at by reconcile passes (and kept): long enough for the
#: editing transaction to have committed, so a plan made from the old definition is caught.
CHANGE_RETENTION = timedelta(minutes=10)


class ClockTimestamp(Func):
    """PostgreSQL's ``clock_timestamp()``: the database's wall clock, not the transaction start."""

    template = "clock_timestamp()"
    output_field = DateTimeField()


class StatementTimestamp(Func):
    """PostgreSQL's ``statement_timestamp()``: the database clock when the statement started.

    Unlike ``clock_timestamp()`` it is stable within a statement, so a comparison with it is an
    index condition: the claim's scan of the pending-runs index stops at the first run not due,
    instead of reading every pending run and filtering each.
    """

    template = "statement_timestamp()"
    output_field = DateTimeField()


@dataclass(frozen=True)
class Poll:
    """One look at the ledger: the database clock, the earliest pending run, the edit marker."""

    now: datetime
    next_due: datetime | None
    change_marker: datetime | None

    def seconds_until_due(self) -> float | None:
        """Seconds from ``now`` until the earliest pending run (<= 0 when one is due)."""
        if self.next_due is None:
            return None
        return (self.next_due - self.now).total_seconds()


@dataclass(frozen=True)
class Dispatched:
    """A run this replica committed as dispatched (or failed/cancelled while claiming)."""

    run_id: int
    periodic_task_name: str
    status: str
    lateness: float | None
    task_id: str
    trigger: str = "schedule"
    #: What the misfire policy did with a late run: "missed", "coalesced", "caught_up" or "".
    misfire: str = ""
    #: Slots that misfire covered: missed rows' slots, a coalesced run's slots, 1 caught up.
    misfired_slots: int = 0
    reason: str = ""


def configure_session(using: str = "default") -> None:
    """Apply the scheduler's server-side bounds to its connection, once per connection.

    ``idle_in_transaction_session_timeout`` and ``statement_timeout`` bound how long a frozen or
    partitioned replica can hold its claim (invariant 8, docs/architecture.md); the TCP keepalive
    settings let the server notice a vanished client. ``application_name`` is
    ``scheduling-beat:<replica id>`` (cut to 63 bytes), so ``pg_stat_activity`` shows which
    session is which replica's.
    """
    from scheduling.conf import conf

    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    if getattr(connection, "_scheduling_session", None) is raw:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false),"
            " set_config('statement_timeout', %s, false),"
            " set_config('tcp_keepalives_idle', %s, false),"
            " set_config('tcp_keepalives_interval', %s, false),"
            " set_config('tcp_keepalives_count', %s, false),"
            " set_config('application_name', %s, false)",
            [
                f"{int(conf.idle_in_transaction_timeout * 1000)}ms",
                f"{int(conf.statement_timeout * 1000)}ms",
                str(conf.tcp_keepalives_idle),
                str(max(1, conf.tcp_keepalives_idle // 2)),
                "3",
                application_name(conf.replica_id),
            ],
        )
    connection._scheduling_session = raw  # type: ignore[attr-defined]


def application_name(replica_id: str) -> str:
    """Return the ``application_name`` of replica ``replica_id``'s scheduler session."""
    return f"scheduling-beat:{replica_id}".encode()[:63].decode(errors="ignore")


def poll(using: str = "default") -> Poll:
    """Return the database clock, the earliest pending run's slot and the edit marker, in one query.

    This is the whole cost of an idle tick, whatever the number of periodic tasks: the earliest
    pending run is the first entry of the partial index on pending runs (``ORDER BY ... LIMIT 1``
    reads one entry whatever the table's statistics say; ``min()`` may be planned as a scan of
    the whole index while the statistics are stale).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT clock_timestamp(),"
            " (SELECT scheduled_for FROM scheduling_run WHERE status = 'pending'"
            "  ORDER BY scheduled_for LIMIT 1),"
            " (SELECT last_update FROM django_celery_beat_periodictasks WHERE ident = 1)"
        )
        now, next_due, marker = cursor.fetchone()
    return Poll(now=now, next_due=next_due, change_marker=marker)


def database_now(using: str = "default") -> datetime:
    """Return the database's ``clock_timestamp()`` (aware, UTC)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


#: Key of the transaction-level advisory lock that serializes CELERY_BEAT_SCHEDULE syncs.
_BEAT_SCHEDULE_LOCK = 0x5C4ED01E
#: Key of the session-level advisory lock a replica holds while it reconciles.
_RECONCILE_LOCK = 0x5C4ED01F


@contextmanager
def reconcile_turn(using: str = "default") -> Iterator[bool]:
    """Yield whether this replica may reconcile now: no other replica is reconciling.

    ``pg_try_advisory_lock`` (session level, released on exit or when the session ends, a killed
    replica included): replicas that see the same edit re-plan it one after another, not all at
    once, and the others go on dispatching meanwhile. A session-level lock outlives no session,
    but nothing ends a session that is frozen between transactions: the scheduler bounds its
    wait (``schedulers.TURN_PATIENCE``).
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_RECONCILE_LOCK])
        mine = cursor.fetchone()[0]
    try:
        yield mine
    finally:
        if mine:
            with connections[using].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_RECONCILE_LOCK])


@contextmanager
def beat_schedule_sync(using: str = "default") -> Iterator[None]:
    """Run the body in one transaction that holds the beat_schedule sync lock.

    ``pg_advisory_xact_lock`` makes replicas starting at once sync ``CELERY_BEAT_SCHEDULE`` one
    after another: the first creates the periodic tasks and schedule rows, the others find them
    and write nothing (django-celery-beat's schedule rows have no unique constraint, so without it
    concurrent replicas create duplicates and then keep moving tasks between them). The lock ends
    with the transaction (commit, rollback or a dead connection); the body should use a savepoint
    (``transaction.atomic``) per entry so one bad entry does not roll back the others.
    """
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_BEAT_SCHEDULE_LOCK])
        yield


# Planning ---------------------------------------------------------------------------------------


def reconcile(
    grace: timedelta,
    using: str = "default",
    *,
    full: bool = True,
    lost: LostExecutions | None = None,
) -> int:
    """Bring the pending runs in line with the periodic tasks; return the number of runs planned.

    1. Pending runs of deleted tasks, and pending scheduled runs of disabled tasks, are cancelled.
    2. Pending scheduled runs not yet due whose task or schedule row (crontab, interval, solar,
       clocked, possibly shared by many tasks) changed are cancelled and planned again from the
       new definition, when the slot changed (see ``_replan_edited``).
    3. Every enabled task without a pending scheduled run gets one (its next slot), or is disabled
       when its schedule is over (clocked time passed, expired, one-off done).
    4. With ``lost`` (the replica's memory of runs seen without their execution lock): running
       runs whose worker is gone are closed as failed, "worker lost" (``close_lost_executions``).

    ``full=False`` (the scheduler's passes after its first) looks only at what the change log
    (``ScheduleChange``: edits, creations, schedules that failed to give a slot at claim time)
    names, plus pending runs whose task was deleted: its cost follows the changes, not the number
    of tasks, and with no change it is three short indexed queries. ``full=True`` checks every
    task (at a replica's start, and as a safety net every SCHEDULING_FULL_RECONCILE_INTERVAL).

    Safe to run from any number of replicas at once: rows being claimed are skipped, and the unique
    constraints drop concurrent duplicates (invariant 1).
    """
    changed = _recent_changes(using)
    unplanned = changed.pop(ScheduleChange.Kind.UNPLANNED, set())
    _cancel_orphans(using, None if full else changed.get(ScheduleChange.Kind.TASK, set()))
    _replan_edited(using, changed)
    if full:
        planned = plan_missing(grace, using)
    elif changed or unplanned:
        only = _affected(changed, prefix="") | Q(id__in=sorted(unplanned))
        planned = plan_missing(grace, using, only=only)
    else:
        planned = 0
    if lost is not None:
        close_lost_executions(lost, using)
    return planned


def _recent_changes(using: str) -> dict[str, set[int]]:
    """Prune the change log past CHANGE_RETENTION; return what it names, by kind."""
    log = ScheduleChange.objects.using(using)
    log.filter(changed_at__lt=ClockTimestamp() - CHANGE_RETENTION).delete()
    changed: dict[str, set[int]] = {}
    for kind, object_id in log.values_list("kind", "object_id"):
        changed.setdefault(kind, set()).add(object_id)
    return changed


def _affected(changed: dict[str, set[int]], prefix: str) -> Q:
    """Tasks named in ``changed``, or using a schedule row named there (``prefix`` to the task)."""
    affected = Q()
    for kind, ids in changed.items():
        field = "id" if kind == ScheduleChange.Kind.TASK else f"{kind}_id"
        affected |= Q(**{f"{prefix}{field}__in": sorted(ids)})
    return affected


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


def _cancel_orphans(using: str, task_ids: set[int] | None) -> None:
    """Cancel pending runs of deleted tasks, and scheduled ones of disabled tasks.

    ``task_ids``: look for disabled tasks among these only (None: among all).
    """
    orphan = Q(periodic_task__isnull=True)
    disabled = Q(trigger=Run.Trigger.SCHEDULE, periodic_task__enabled=False)
    if task_ids is None:
        orphan |= disabled
    elif task_ids:
        orphan |= disabled & Q(periodic_task_id__in=sorted(task_ids))
    with transaction.atomic(using=using):
        orphans = list(
            Run.objects.using(using)
            .pending()
            .filter(orphan)
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", "periodic_task_id")
        )
        if not orphans:
            return
        deleted = [pk for pk, task_id in orphans if task_id is None]
        disabled_runs = [pk for pk, task_id in orphans if task_id is not None]
        reasons = ((deleted, "periodic task deleted"), (disabled_runs, "periodic task disabled"))
        for ids, reason in reasons:
            if ids:
                Run.objects.using(using).filter(pk__in=ids).update(
                    status=Run.Status.CANCELLED, reason=reason, finished_at=ClockTimestamp()
                )
                logger.info(
                    "cancelled %d pending runs: %s", len(ids), reason, extra={"action": "cancel"}
                )


def _replan_edited(using: str, changed: dict[str, set[int]] | None = None) -> None:
    """Re-plan the pending runs whose definition changed recently; cost follows the changes.

    The change log (``ScheduleChange``, written by database triggers on every UPDATE of a periodic
    task's scheduling columns or of a schedule row, including ``QuerySet.update()`` and raw SQL)
    names what changed in the last CHANGE_RETENTION (``changed``, by kind; read from the log when
    None, less the unplanned entries, which only ``plan_missing`` uses). Only the pending, not
    yet due scheduled runs of tasks named there, or using a schedule row named there, are looked
    at: each gets its slot
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
        changed = _recent_changes(using)
        changed.pop(ScheduleChange.Kind.UNPLANNED, None)
    if not changed:
        return
    with transaction.atomic(using=using):
        now = database_now(using)
        edited = list(
            Run.objects.using(using)
            .pending()
            .scheduled()
            .filter(
                _affected(changed, prefix="periodic_task__"),
                periodic_task__enabled=True,
                scheduled_for__gt=ClockTimestamp(),
            )
            .annotate(last_slot=Subquery(_last_slot_of_task()))
            .select_related(*_SCHEDULE_RELATED)
            .select_for_update(skip_locked=True, of=("self",))
        )
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
        if moved:
            Run.objects.using(using).filter(pk__in=moved).update(
                status=Run.Status.CANCELLED, reason="schedule edited", finished_at=ClockTimestamp()
            )
        _insert_pending(replacements, using)


def _last_slot_of_task() -> QuerySet[Run]:
    """The newest slot the row's task ran (or missed, skipped...): not pending, not cancelled."""
    return (
        Run.objects.scheduled()
        .filter(periodic_task=OuterRef("periodic_task"))
        .exclude(status__in=(Run.Status.PENDING, Run.Status.CANCELLED))
        .order_by("-scheduled_for")
        .values("scheduled_for")[:1]
    )


def plan_missing(
    grace: timedelta, using: str = "default", chunk_size: int = 2000, only: Q | None = None
) -> int:
    """Plan the next slot of every enabled task that has no pending scheduled run.

    ``only`` restricts the tasks looked at (a filter on PeriodicTask), for incremental passes.

    Returns the number of runs inserted (concurrent planners' duplicates are dropped by the unique
    constraints, and not counted). A task whose schedule cannot produce a slot gets one failed run
    with the error (once per distinct error) and keeps its other runs' history.
    """
    pending = Run.objects.filter(
        periodic_task=OuterRef("pk"), trigger=Run.Trigger.SCHEDULE, status=Run.Status.PENDING
    )
    latest = (
        Run.objects.filter(periodic_task=OuterRef("pk"), trigger=Run.Trigger.SCHEDULE)
        .exclude(status=Run.Status.CANCELLED)
        .order_by("-scheduled_for")
    )
    tasks = (
        PeriodicTask.objects.using(using)
        .filter(Q(enabled=True) & (only if only is not None else Q()))
        .exclude(Exists(pending))
        .annotate(
            last_slot=Subquery(latest.values("scheduled_for")[:1]),
            last_error=Subquery(latest.values("error")[:1]),
        )
        .select_related(*_TASK_RELATED, "scheduling_policy")
        .order_by("pk")
    )
    planned = 0
    now = database_now(using)
    batch: list[tuple[PeriodicTask, datetime]] = []
    failed: list[Run] = []
    finished: list[tuple[int, str]] = []
    for task in _iterate_tasks(tasks, chunk_size, using):
        if isinstance(task, _Unloadable):
            if task.last_error != task.error:
                logger.error(
                    "cannot load periodic task %r (id %s): %s", task.task.name, task.pk, task.error,
                    extra={"action": "plan"},
                )
                failed.append(_failed_plan(task.task, now, task.error))
            continue
        try:
            slot = slots.initial_run(
                task, now, last_slot=task.last_slot, grace=_task_grace(task, grace)
            )
        except ScheduleError as exc:
            if task.last_error != str(exc):
                logger.error(
                    "cannot plan periodic task %r: %s", task.name, exc, extra={"action": "plan"}
                )
                failed.append(_failed_plan(task, now, str(exc)))
            continue
        if slot is None:
            finished.append((task.pk, task.name))
            continue
        batch.append((task, slot))
        if len(batch) >= chunk_size:
            planned += _insert_pending(batch, using)
            batch = []
    planned += _insert_pending(batch, using) + _insert(failed, using)
    if finished:
        PeriodicTask.objects.using(using).filter(pk__in=[pk for pk, _ in finished]).update(
            enabled=False
        )
        names = ", ".join(repr(name) for _, name in finished[:10])
        more = f" and {len(finished) - 10} more" if len(finished) > 10 else ""
        logger.info(
            "disabled %d periodic tasks whose schedule is over (expired, or its one run done):"
            " %s%s", len(finished), names, more, extra={"action": "disable"},
        )
    return planned


#: Errors Django raises while turning a bad row into a model (not database errors).
_LOAD_ERRORS = (ValidationError, ValueError, TypeError, OverflowError, LookupError)


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
        except _LOAD_ERRORS:
            loaded = None
        if loaded is not None:
            yield from loaded
            continue
        for pk in chunk:
            try:
                found = tasks.filter(pk=pk).first()
            except _LOAD_ERRORS as exc:
                bare = PeriodicTask.objects.using(using).only("id", "name", "task").get(pk=pk)
                last_error = (
                    Run.objects.using(using)
                    .scheduled()
                    .filter(periodic_task_id=pk)
                    .exclude(status=Run.Status.CANCELLED)
                    .order_by("-scheduled_for")
                    .values_list("error", flat=True)
                    .first()
                )
                yield _Unloadable(bare, f"cannot load the schedule: {exc}", last_error or "")
            else:
                if found is not None:
                    yield found


def _planned(task: PeriodicTask, slot: datetime, **fields: object) -> Run:
    values: dict[str, object] = {
        "periodic_task": task,
        "periodic_task_name": task.name,
        "task": task.task,
        "scheduled_for": slot,
        "trigger": Run.Trigger.SCHEDULE,
        "status": Run.Status.PENDING,
        "task_id": slots.task_id_for(task.pk, slot),
    }
    return Run(**{**values, **fields})


def _failed_plan(task: PeriodicTask, now: datetime, error: str) -> Run:
    return _planned(
        task,
        now,
        status=Run.Status.FAILED,
        reason="invalid schedule",
        error=error[:_ERROR_LIMIT],
        finished_at=now,
    )


def _insert(runs: list[Run], using: str) -> int:
    """Insert runs in one statement; rows that conflict with a concurrent planner's are dropped.

    ``INSERT ... SELECT FROM unnest(<one array per column>) ON CONFLICT DO NOTHING``: one short
    statement whatever the number of rows (Django's ``bulk_create`` compiles a placeholder and an
    expression per value, which dominated the cost of a claim batch). Returns ``len(runs)``.
    """
    if runs:
        fields = [f for f in Run._meta.concrete_fields if f.name not in ("id", "planned_at")]
        _execute_unnest(
            "INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING",
            fields, runs, using,
        )
    return len(runs)


#: Columns of a newly planned run that come from its task and slot; the others take their defaults.
_PLAN_COLUMNS = ("periodic_task_id", "periodic_task_name", "task", "scheduled_for", "task_id")


def _insert_pending(plans: list[tuple[PeriodicTask, datetime]], using: str) -> int:
    """Insert one pending scheduled run per ``(task, slot)`` (aware UTC); conflicts are dropped.

    The planning hot path (every dispatch plans the task's next slot): five arrays (task id and
    name, Celery task, slot, Celery task id) and the other columns' defaults as constants, with no
    model instance built per row. Returns ``len(plans)``.
    """
    if not plans:
        return 0
    connection = connections[using]
    fields = [f for f in Run._meta.concrete_fields if f.name not in ("id", "planned_at")]
    varying = [f for f in fields if f.attname in _PLAN_COLUMNS]
    constant = [f for f in fields if f.attname not in _PLAN_COLUMNS]
    query = sql.SQL(
        "INSERT INTO {table} ({columns}) SELECT v.*, {constants} FROM unnest({arrays}) AS v"
        " ON CONFLICT DO NOTHING"
    ).format(
        table=sql.Identifier(Run._meta.db_table),
        columns=sql.SQL(", ").join(sql.Identifier(f.column) for f in [*varying, *constant]),
        constants=sql.SQL(", ").join(
            sql.SQL("%s::{}").format(sql.SQL(f.db_type(connection))) for f in constant
        ),
        arrays=sql.SQL(", ").join(
            sql.SQL("%s::{}[]").format(sql.SQL(f.db_type(connection))) for f in varying
        ),
    )
    values = {
        "periodic_task_id": [task.pk for task, _ in plans],
        "periodic_task_name": [task.name for task, _ in plans],
        "task": [task.task for task, _ in plans],
        "scheduled_for": [slot for _, slot in plans],
        "task_id": [slots.task_id_for(task.pk, slot) for task, slot in plans],
    }
    defaults = {"trigger": Run.Trigger.SCHEDULE, "status": Run.Status.PENDING}
    params = [defaults.get(f.attname, f.get_default()) for f in constant] + [
        values[f.attname] for f in varying
    ]  # in the statement's order: the constants, then the arrays
    with connection.cursor() as cursor:
        cursor.execute(query.as_string(connection.connection), params)
    return len(plans)


def _update_runs(runs: list[Run], names: tuple[str, ...], using: str) -> None:
    """Write the fields ``names`` of ``runs`` (by primary key) in one UPDATE ... FROM unnest."""
    fields = [Run._meta.pk, *(Run._meta.get_field(name) for name in names)]
    _execute_unnest(
        "UPDATE {table} AS r SET {assignments} FROM unnest({arrays}) AS v({columns})"
        " WHERE r.id = v.id",
        fields, runs, using,
    )


def _execute_unnest(template: str, fields: list, runs: list[Run], using: str) -> None:
    """Run ``template`` with one typed array parameter per field, holding every run's value."""
    connection = connections[using]
    columns = [sql.Identifier(f.column) for f in fields]
    query = sql.SQL(template).format(
        table=sql.Identifier(Run._meta.db_table),
        columns=sql.SQL(", ").join(columns),
        arrays=sql.SQL(", ").join(
            sql.SQL("%s::{}[]").format(sql.SQL(f.db_type(connection))) for f in fields
        ),
        assignments=sql.SQL(", ").join(
            sql.SQL("{} = v.{}").format(c, c) for c in columns[1:]
        ),
    )
    # The attributes as they are: ints, strings and aware datetimes, which psycopg adapts
    # (Django's per-value get_db_prep_save was most of a claim's cost in Python).
    values = [[getattr(run, f.attname) for run in runs] for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(query.as_string(connection.connection), values)


# Claim and dispatch -----------------------------------------------------------------------------


def claim_and_dispatch(
    publish: Publish,
    *,
    replica_id: str,
    batch_size: int,
    grace: timedelta,
    pause_after_publish: float = 0.0,
    flush: Callable[[], None] | None = None,
    using: str = "default",
) -> list[Dispatched]:
    """Claim due pending runs, publish them, mark them dispatched, plan the next; one transaction.

    ``publish(message)`` sends one Celery message; it raises RunRejected for a run that cannot be
    sent (the run is recorded failed and the others go on) and lets broker errors propagate, which
    rolls the whole claim back so nothing is marked dispatched unless its publish succeeded.
    ``flush()``, when given, sends what a buffering publisher holds (kombu's ``Producer.batch``:
    one Redis pipeline); it is called after every FLUSH_EVERY published runs and after the last,
    before the ledger writes, and each run's ``dispatched_at`` is the moment its flush returned,
    so lateness is measured to the broker. Its errors roll the claim back like a publish error.
    Returns what was committed; an empty list when nothing was due or every due run is being
    claimed by another replica.

    A run later than its grace period after its slot is a misfire, handled by the task's misfire
    policy (``TaskPolicy``, loaded in the claim query; ``grace`` is the default grace period, a
    task's ``misfire_grace_seconds`` overrides it): see ``_misfire``.

    Overlap policy skip (``TaskPolicy``): a scheduled or backfill run due while an earlier run of
    its task is dispatched, running or retrying (dispatched less than the staleness bound ago:
    ``overlap_stale_seconds``, else ``SCHEDULING_OVERLAP_STALE_SECONDS``), or dispatched earlier in
    this batch, is recorded skipped with the reason, and the next slot is planned as usual. The
    claim query loads the policy and the newest unfinished run's dispatch time with each row.
    """
    with transaction.atomic(using=using):
        runs = _claim_due(batch_size, using)
        if not runs:
            return []
        claimed_at, started = runs[0].db_now, time.monotonic()
        following: list[tuple[PeriodicTask, datetime]] = []
        missed: list[Run] = []
        task_updates: dict[int, _TaskUpdate] = {}
        busy: set[int] = set()
        unplanned: set[int] = set()
        unsent: list[Run] = []

        def send() -> None:
            if flush is not None and unsent:
                _flush(flush, unsent)
                sent_at = claimed_at + timedelta(seconds=time.monotonic() - started)
                for published in unsent:
                    published.dispatched_at = sent_at
            unsent.clear()

        for run in runs:
            now = claimed_at + timedelta(seconds=time.monotonic() - started)
            run.overlap = _overlap(run, busy)
            mark = len(missed)  # rows after it: the slots this run's misfire records missed
            try:
                nxt, over = _dispatch_one(run, publish, now, grace, replica_id, missed)
            except PublishFailed:
                raise  # the broker: roll the whole claim back
            except Exception as exc:  # noqa: BLE001 - one bad row must not stop the batch
                logger.exception(
                    "cannot dispatch run %s of %r", run.task_id, run.periodic_task_name,
                    extra={"action": "dispatch_failed"},
                )
                _close(run, Run.Status.FAILED, "error while dispatching", now, error=repr(exc))
                nxt, over = None, False
            run.missed_after = sum(row.slots for row in missed[mark:])
            if run.status == Run.Status.DISPATCHED:
                unsent.append(run)
                if len(unsent) >= FLUSH_EVERY:
                    send()
                if run.periodic_task_id is not None:
                    busy.add(run.periodic_task_id)
            task = run.periodic_task
            if task is None or run.trigger != Run.Trigger.SCHEDULE:
                continue
            update = task_updates.setdefault(task.pk, _TaskUpdate())
            if run.status == Run.Status.DISPATCHED:
                update.ran(run.scheduled_for)
            update.disable = update.disable or over
            if nxt is not None:
                following.append((task, nxt))
            elif not over and task.enabled and run.status != Run.Status.CANCELLED:
                unplanned.add(task.pk)  # its schedule gave no next slot: reconcile says why
        send()
        # Not in a psycopg pipeline: after one, PostgreSQL did not end the session when it then
        # sat idle in the transaction, and that bound is what frees a frozen replica's claim.
        _update_runs(
            runs,
            ("status", "reason", "slots", "claimed_by", "dispatched_at", "error", "finished_at"),
            using,
        )
        _insert(missed, using)
        _insert_pending(following, using)
        _update_tasks(task_updates, using)
        if unplanned:
            note_unplanned(unplanned, using)
        if pause_after_publish:
            logger.warning(
                "test pause: published %s, sleeping %.1fs before commit",
                ",".join(run.task_id for run in runs), pause_after_publish,
                extra={"action": "test_pause"},
            )
            time.sleep(pause_after_publish)
    result = [
        Dispatched(
            run_id=run.pk,
            periodic_task_name=run.periodic_task_name,
            status=run.status,
            lateness=None if run.lateness is None else run.lateness.total_seconds(),
            task_id=run.task_id,
            trigger=run.trigger,
            **_misfire_outcome(run),
            reason=run.reason,
        )
        for run in runs
    ]
    for item in result:
        if item.status == Run.Status.DISPATCHED:
            logger.info(
                "dispatched %s (task id %s), lateness %.3fs",
                item.periodic_task_name, item.task_id, item.lateness or 0.0,
                extra={"action": "dispatch", "replica": replica_id},
            )
        elif item.status == Run.Status.SKIPPED:
            logger.info(
                "skipped %s (task id %s): the previous run is not finished",
                item.periodic_task_name, item.task_id,
                extra={"action": "skip", "replica": replica_id},
            )
        elif item.status == Run.Status.CANCELLED:
            logger.info(
                "cancelled %s (task id %s): %s", item.periodic_task_name, item.task_id,
                item.reason, extra={"action": "cancel", "replica": replica_id},
            )
    return result


def _flush(flush: Callable[[], None], runs: list[Run]) -> None:
    """Send the buffered messages of ``runs``; raise PublishFailed naming them if that fails."""
    try:
        flush()
    except Exception as exc:
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        ids = ", ".join(run.task_id for run in runs)
        raise PublishFailed(f"cannot publish runs {ids}: {exc}{cause}") from exc


def _claim_due(batch_size: int, using: str) -> list[Run]:
    """Lock up to ``batch_size`` due pending runs (SKIP LOCKED) with their tasks and policies.

    A schedule row Django cannot load (an unknown time zone written by raw SQL, say) must not stop
    every other run: on such an error, raised in Python while the rows are turned into models
    (the query itself succeeded and its locks are held), the runs are claimed alone and each task
    is loaded on its own; a task that still cannot be loaded leaves its run ``load_error`` set,
    and the run is recorded failed with that error.
    """
    try:
        return _CompiledClaim.of(batch_size, using).fetch()
    except _LOAD_ERRORS as exc:
        logger.error(
            "a schedule row cannot be loaded (%s); claiming run by run", exc,
            extra={"action": "load_failed"},
        )
    runs = list(_due(using)[:batch_size])
    tasks = _load_tasks({run.periodic_task_id for run in runs if run.periodic_task_id}, using)
    for run in runs:
        if run.periodic_task_id is None:
            continue
        loaded = tasks.get(run.periodic_task_id)
        if isinstance(loaded, Exception):
            run.load_error = f"cannot load the periodic task or its schedule: {loaded}"
        elif loaded is not None:
            run.periodic_task = loaded
    return runs


def _due(using: str) -> QuerySet[Run]:
    """Due pending runs in claim order, locked with SKIP LOCKED, with the clock and overlap data.

    Constants are SQL literals, not parameters, so the prepared statement's generic plan can use
    the partial indexes (a predicate ``status = $1`` cannot prove ``status = 'pending'``).
    """
    return (
        Run.objects.using(using)
        .filter(status=_literal(Run.Status.PENDING), scheduled_for__lte=StatementTimestamp())
        .annotate(db_now=ClockTimestamp(), busy_since=_busy_since())
        .order_by("scheduled_for", "pk")
        .select_for_update(skip_locked=True, of=("self",))
    )


def _literal(value: str) -> RawSQL:
    """``value`` written into the SQL as a quoted literal (psycopg's quoting), not a parameter."""
    return RawSQL(sql.Literal(str(value)).as_string(), (), output_field=TextField())


class _CompiledClaim:
    """The claim query, compiled by Django once per connection and batch size, sent prepared.

    Django compiles a queryset at every evaluation: for this one (seven tables and a subquery)
    that was about 5 ms of CPU per claim, more than the claim's execution for a few runs. The SQL
    and the model layout are kept, and each claim only executes (prepared: ``_prepared``) and
    builds the instances the way Django's ModelIterable does.
    """

    def __init__(self, batch_size: int, using: str) -> None:
        queryset = _due(using).select_related(
            *_SCHEDULE_RELATED, "periodic_task__scheduling_policy"
        )[:batch_size]
        self.using = using
        self.compiler = queryset.query.get_compiler(using=using)
        self.sql, self.params = self.compiler.as_sql()  # also fills select and klass_info
        info = self.compiler.klass_info
        start, end = info["select_fields"][0], info["select_fields"][-1] + 1
        self.fields = slice(start, end)
        self.names = [column[0].target.attname for column in self.compiler.select[start:end]]
        self.related = get_related_populators(info, self.compiler.select, using)
        self.annotations = self.compiler.annotation_col_map

    @classmethod
    def of(cls, batch_size: int, using: str) -> _CompiledClaim:
        """The compiled claim of this batch size on connection ``using`` (compiled on first use)."""
        connection = connections[using]
        cache = connection.__dict__.setdefault("_scheduling_claims", {})
        if batch_size not in cache:
            cache[batch_size] = cls(batch_size, using)
        return cache[batch_size]

    def fetch(self) -> list[Run]:
        """Execute the claim (in the caller's transaction); return the locked runs."""
        with _prepared(self.using), connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, self.params)
            rows = cursor.fetchall()
        runs = []
        for row in self.compiler.results_iter([rows]):
            run = Run.from_db(self.using, self.names, row[self.fields])
            for populator in self.related:
                populator.populate(row, run)
            for name, position in self.annotations.items():
                setattr(run, name, row[position])
            runs.append(run)
        return runs


@contextmanager
def _prepared(using: str) -> Iterator[None]:
    """Send the body's queries as server-side prepared statements, when psycopg 3 is in use.

    Django binds parameters on the client, so PostgreSQL plans every statement anew: for the
    claim query (seven tables and the overlap subquery) planning took about 4 ms, several times
    its execution, at every claim. Here the body runs on psycopg's server-side binding cursor with
    ``prepare_threshold`` 0: the statement is prepared once per session and then only executed.
    The body must send the same statements every time (not savepoints, whose names change), or
    it fills psycopg's cache of prepared statements. ``SCHEDULING_PREPARED_CLAIM = False`` turns
    this off (a pooler that cannot keep prepared statements).
    """
    raw = connections[using].connection
    if not conf.prepared_claim or not hasattr(raw, "prepare_threshold"):
        yield  # psycopg 2, or turned off
        return
    from django.db.backends.postgresql.base import ServerBindingCursor

    factory, threshold = raw.cursor_factory, raw.prepare_threshold
    raw.cursor_factory, raw.prepare_threshold = ServerBindingCursor, 0
    try:
        yield
    finally:
        raw.cursor_factory, raw.prepare_threshold = factory, threshold


def _load_tasks(ids: set[int], using: str) -> dict[int, PeriodicTask | Exception]:
    """Load tasks with their schedules and policies one by one; errors are returned, not raised."""
    query = PeriodicTask.objects.using(using).select_related(*_TASK_RELATED, "scheduling_policy")
    loaded: dict[int, PeriodicTask | Exception] = {}
    for pk in sorted(ids):
        try:
            with transaction.atomic(using=using):
                found = query.filter(pk=pk).first()
        except _LOAD_ERRORS as exc:
            loaded[pk] = exc
        else:
            if found is not None:
                loaded[pk] = found
    return loaded


def _busy_since() -> Case:
    """The newest dispatch time of an unfinished run of the row's task, for overlap skip only."""
    unfinished = Run.objects.filter(
        _any_status(Run.UNFINISHED_STATUSES), periodic_task=OuterRef("periodic_task")
    ).order_by(F("dispatched_at").desc(nulls_last=True))
    return Case(
        When(
            periodic_task__scheduling_policy__overlap_policy=_literal(TaskPolicy.Overlap.SKIP),
            then=Subquery(unfinished.values("dispatched_at")[:1]),
        ),
        default=None,
        output_field=DateTimeField(),
    )


def _any_status(statuses: tuple[str, ...]) -> Q:
    """``status IN (...)`` as literals (``_literal``): the partial index's predicate is proven."""
    condition = Q()
    for status in statuses:
        condition |= Q(status=_literal(status))
    return condition


def _overlap(run: Run, busy: set[int]) -> str:
    """Return why ``run`` is skipped under its task's overlap policy, or "" to dispatch it."""
    task = run.periodic_task
    if task is None or run.trigger == Run.Trigger.MANUAL:
        return ""
    policy = getattr(task, "scheduling_policy", None)
    if policy is None or policy.overlap_policy != TaskPolicy.Overlap.SKIP:
        return ""
    if task.pk in busy:
        return "overlap: an earlier run of this task was dispatched in the same batch"
    since = run.busy_since  # type: ignore[attr-defined]
    if since is None:
        return ""
    stale = policy.overlap_stale_seconds
    bound = timedelta(seconds=conf.overlap_stale_seconds if stale is None else stale)
    if run.db_now - since > bound:  # type: ignore[attr-defined]
        logger.warning(
            "run of %r at %s: the unfinished run dispatched at %s is older than %s; not skipping",
            task.name, run.scheduled_for, since, bound, extra={"action": "overlap_stale"},
        )
        return ""
    return f"overlap: the run dispatched at {since.isoformat()} is not finished"


@dataclass
class _TaskUpdate:
    last_slot: datetime | None = None
    runs: int = 0
    disable: bool = False

    def ran(self, slot: datetime) -> None:
        self.runs += 1
        if self.last_slot is None or slot > self.last_slot:
            self.last_slot = slot


def _over(task: PeriodicTask, run: Run) -> bool:
    return task.expires is not None and run.scheduled_for >= task.expires


def _dispatch_one(
    run: Run,
    publish: Publish,
    now: datetime,
    grace: timedelta,
    replica_id: str,
    missed: list[Run] | None = None,
) -> tuple[datetime | None, bool]:
    """Publish one claimed run and set its outcome fields.

    Returns ``(next slot to plan or None, whether the task's schedule is over)``. A schedule that
    fails to give a next slot is logged and left enabled; the reconcile pass records its error.
    Rows for slots a misfire records as missed are appended to ``missed`` (to be inserted).
    """
    run.claimed_by = replica_id
    load_error = getattr(run, "load_error", "")
    if load_error:
        logger.error("run %s failed: %s", run.task_id, load_error, extra={"action": "load_failed"})
        _close(run, Run.Status.FAILED, "invalid schedule", now, error=load_error)
        return None, False
    task = run.periodic_task
    if task is None:
        _close(run, Run.Status.CANCELLED, "periodic task deleted", now)
        return None, False
    scheduled = run.trigger == Run.Trigger.SCHEDULE
    if scheduled and not task.enabled:
        _close(run, Run.Status.CANCELLED, "periodic task disabled", now)
        return None, False
    if scheduled and _over(task, run):
        _close(run, Run.Status.CANCELLED, "periodic task expired", now)
        return None, True
    nxt: datetime | None = None
    over = scheduled and task.one_off
    if over and _one_off_missed(run, task, now, grace):
        return None, True
    if scheduled and not task.one_off:
        try:
            late = _misfire(run, task, now, grace, replica_id)
            if late is None:
                nxt = slots.next_run(task, run.scheduled_for)
            else:
                nxt, rows = late
                if missed is not None:
                    missed.extend(rows)
            over = nxt is None
        except ScheduleError as exc:
            logger.error(
                "cannot plan the run after %s of %r: %s", run.scheduled_for, task.name, exc,
                extra={"action": "plan"},
            )
        if run.status == Run.Status.MISSED:
            return nxt, over
    if getattr(run, "overlap", ""):  # overlap policy skip (claim_and_dispatch decides)
        _close(run, Run.Status.SKIPPED, run.overlap, now)  # type: ignore[attr-defined]
        return nxt, over
    try:
        message = build_message(run, task)
        try:
            publish(message)
        except RunRejected:
            raise
        except Exception as exc:
            raise PublishFailed(f"cannot publish run {run.task_id}: {exc}") from exc
    except RunRejected as exc:
        logger.error(
            "run of %r at %s rejected: %s", task.name, run.scheduled_for, exc,
            extra={"action": "reject"},
        )
        _close(run, Run.Status.FAILED, "rejected before dispatch", now, error=str(exc))
        return nxt, over
    run.status = Run.Status.DISPATCHED
    run.dispatched_at = now
    return nxt, over


def _misfire(
    run: Run, task: PeriodicTask, now: datetime, default_grace: timedelta, replica_id: str
) -> tuple[datetime | None, list[Run]] | None:
    """Apply the task's misfire policy to a claimed run; None when the run is not a misfire.

    The run is a misfire when ``now - scheduled_for`` exceeds the grace period: the task's
    ``TaskPolicy.misfire_grace_seconds`` (seconds) when set, else ``default_grace``. Returns
    ``(next slot to plan or None, rows of missed slots to insert)`` and sets the run's fields:

    - coalesce (the default, also for a task without a policy row): the run is dispatched once,
      standing for itself and every slot up to ``now`` (``slots``); the next slot is after ``now``.
    - skip: the run and every later slot at or before ``now - grace`` are recorded ``missed``
      (one row each, at most MISSED_ROWS_LIMIT more; the last row's ``slots`` counts the rest);
      the next slot is the first one after ``now - grace`` (it is dispatched at once if already
      due: a slot still inside its grace period runs under every policy).
    - catch_up: the missed slots (this run's and the later ones at or before ``now - grace``) are
      dispatched one by one in order, one run each, the most recent ``catch_up_limit`` of them;
      older ones are recorded ``missed`` like skip. The rule is stateless: each late run of the
      replay counts the missed slots after it, so the replay stops being late after the cap.

    An interval's missed slots are counted exactly by arithmetic, so years of a 1 s interval are
    accounted for in one claim (MISSED_ROWS_LIMIT rows, the last one's ``slots`` counting the
    rest). Other schedules are counted slot by slot: past ``slots.MAX_COUNTED_SLOTS`` missed
    slots, skip and catch_up account for that many in one claim and plan the slot after them,
    still late, so the next claims go on until every slot is accounted for.

    Raises ScheduleError when the schedule cannot produce the following slots.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    grace = _task_grace(task, default_grace)
    lateness = now - run.scheduled_for
    if lateness <= grace:
        return None
    kind = TaskPolicy.Misfire.COALESCE if policy is None else policy.misfire_policy
    if kind == TaskPolicy.Misfire.CATCH_UP or kind == TaskPolicy.Misfire.SKIP:
        assert policy is not None
        later, following = slots.slots_through(
            task, run.scheduled_for, now - grace, cap=_SLOTS_COLUMN_MAX - MISSED_ROWS_LIMIT
        )
        limit = policy.catch_up_limit if kind == TaskPolicy.Misfire.CATCH_UP else 0
        if later < limit:  # among the most recent ``limit`` missed slots: dispatch it
            run.reason = f"misfire: caught up {lateness.total_seconds():.3f} s late"
            return slots.next_run(task, run.scheduled_for), []
        skipped = later + 1 - limit  # this run and the following slots that will not run
        if limit or later >= slots.MAX_COUNTED_SLOTS:
            # the slot after the skipped ones; past the counting cap that is still late, and the
            # next claim goes on from there, so every slot is accounted for
            following = slots.nth_slot_after(task, run.scheduled_for, skipped)
        reason = (
            f"misfire: {kind} policy, {lateness.total_seconds():.3f} s late"
            f" (grace {grace.total_seconds():g} s)"
        )
        _close(run, Run.Status.MISSED, reason, now)
        rows = [
            _planned(
                task, slot, status=Run.Status.MISSED, reason=reason, claimed_by=replica_id,
                finished_at=now,
            )
            for slot in slots.slots_after(
                task, run.scheduled_for, min(skipped - 1, MISSED_ROWS_LIMIT)
            )
        ]
        if rows and skipped - 1 > MISSED_ROWS_LIMIT:
            rows[-1].slots = skipped - MISSED_ROWS_LIMIT
        logger.warning(
            "misfire of %r: %d slots from %s recorded missed (%s policy)",
            task.name, skipped, run.scheduled_for, kind, extra={"action": "misfire"},
        )
        return following, rows
    missed, nxt = slots.slots_through(task, run.scheduled_for, now)
    run.slots = 1 + missed
    run.reason = f"misfire: coalesced {run.slots} slots"
    return nxt, []


def _misfire_outcome(run: Run) -> dict[str, object]:
    """Classify what ``_misfire`` (or ``_one_off_missed``) did with a claimed run, for metrics."""
    if run.status == Run.Status.MISSED:
        return {"misfire": "missed", "misfired_slots": run.slots + getattr(run, "missed_after", 0)}
    if run.reason.startswith("misfire: coalesced"):
        return {"misfire": "coalesced", "misfired_slots": run.slots}
    if run.reason.startswith("misfire: caught up"):
        return {"misfire": "caught_up", "misfired_slots": 1}
    return {}


def _one_off_missed(run: Run, task: PeriodicTask, now: datetime, default_grace: timedelta) -> bool:
    """Record a one-off's single late run ``missed`` when its misfire policy drops late runs.

    Policies skip, and catch_up with ``catch_up_limit`` 0, drop a run later than its grace;
    coalesce and catch_up dispatch it (it stands for one slot). Returns whether it was recorded.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    if policy is None or policy.misfire_policy == TaskPolicy.Misfire.COALESCE:
        return False
    if policy.misfire_policy == TaskPolicy.Misfire.CATCH_UP and policy.catch_up_limit > 0:
        return False
    grace = _task_grace(task, default_grace)
    lateness = now - run.scheduled_for
    if lateness <= grace:
        return False
    _close(
        run, Run.Status.MISSED,
        f"misfire: {policy.misfire_policy} policy, {lateness.total_seconds():.3f} s late"
        f" (grace {grace.total_seconds():g} s)",
        now,
    )
    return True


def _task_grace(task: PeriodicTask, default: timedelta) -> timedelta:
    """The task's misfire grace period: its policy's ``misfire_grace_seconds``, else ``default``.

    Reads the policy cached by ``select_related("scheduling_policy")``; no query of its own then.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    if policy is not None and policy.misfire_grace_seconds is not None:
        return timedelta(seconds=policy.misfire_grace_seconds)
    return default


def _close(run: Run, status: str, reason: str, now: datetime, error: str = "") -> None:
    run.status = status
    run.reason = reason
    run.error = error[:_ERROR_LIMIT]
    run.finished_at = now


def _update_tasks(updates: dict[int, _TaskUpdate], using: str) -> None:
    """Record last_run_at/total_run_count and disable finished tasks, without a schedule reload.

    Plain UPDATEs, not ``save()``: django-celery-beat's change marker is left alone, so no replica
    reloads anything, and ``date_changed`` (the interval anchor) does not move.
    """
    if not updates:
        return
    ids = sorted(updates)
    with connections[using].cursor() as cursor:
        # Lock in id order so two claim transactions touching the same tasks cannot deadlock.
        cursor.execute(
            "SELECT id FROM django_celery_beat_periodictask WHERE id = ANY(%s) ORDER BY id"
            " FOR UPDATE",
            [ids],
        )
        cursor.execute(
            "UPDATE django_celery_beat_periodictask AS t SET"
            " last_run_at = COALESCE(v.last_slot, t.last_run_at),"
            " total_run_count = t.total_run_count + v.runs,"
            " enabled = t.enabled AND NOT v.disable"
            " FROM unnest(%s::integer[], %s::timestamptz[], %s::integer[], %s::boolean[])"
            " AS v(id, last_slot, runs, disable) WHERE t.id = v.id",
            [
                ids,
                [updates[i].last_slot for i in ids],
                [updates[i].runs for i in ids],
                [updates[i].disable for i in ids],
            ],
        )


# Manual runs ------------------------------------------------------------------------------------


def request_run(task: PeriodicTask, *, requested_by: str = "", using: str = "default") -> Run:
    """Create a manual run of ``task`` due now; a replica dispatches it exactly once.

    Manual runs do not move the schedule: the task's next scheduled run stays where it is.
    """
    now = database_now(using)
    run = Run.objects.using(using).create(
        periodic_task=task,
        periodic_task_name=task.name,
        task=task.task,
        scheduled_for=now,
        trigger=Run.Trigger.MANUAL,
        task_id=str(uuid.uuid4()),
        requested_by=requested_by,
    )
    logger.info(
        "manual run of %r requested by %s", task.name, requested_by or "-",
        extra={"action": "run_now"},
    )
    return run


# Backfill ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackfillProgress:
    """Where a backfill stands: slots seen and runs created so far, the last slot, 0..1 done."""

    slots: int
    created: int
    last_slot: datetime | None
    fraction: float


def backfill(
    task: PeriodicTask,
    since: datetime,
    until: datetime,
    *,
    requested_by: str = "",
    chunk_size: int = 1000,
    progress: Callable[[BackfillProgress], None] | None = None,
    using: str = "default",
) -> BackfillProgress:
    """Create a backfill run of ``task`` for each slot in ``[since, until)``; return the totals.

    ``since`` and ``until`` are aware datetimes; ``until`` must not be after the database clock.
    Slots come from ``slots.next_run`` chaining from ``since``. The runs are due at once and are
    dispatched in slot order by the replicas, subject to the task's overlap policy (under skip,
    a backfill run due while another run of the task is unfinished is recorded skipped).
    Idempotent: a slot that already has a backfill run is left alone (unique constraint
    ``scheduling_run_one_backfill_per_slot``), so asking twice creates nothing new. ``progress``
    is called after each chunk of ``chunk_size`` slots.

    Raises BackfillRejected for an empty or future range, ScheduleError for a broken schedule.
    """
    if since >= until:
        raise BackfillRejected(f"empty range: since {since.isoformat()} is not before until")
    now = database_now(using)
    if until > now:
        raise BackfillRejected(
            f"until {until.isoformat()} is in the future (database clock {now.isoformat()})"
        )
    seen = created = 0
    last: datetime | None = None
    chunk: list[datetime] = []

    def flush() -> None:
        nonlocal created
        created += _insert_backfill(task, chunk, requested_by, using)
        chunk.clear()
        if progress is not None:
            progress(_backfill_progress(seen, created, last, since, until))

    for slot in slots.slots_between(task, since, until):
        seen, last = seen + 1, slot
        chunk.append(slot)
        if len(chunk) >= chunk_size:
            flush()
    if chunk:
        flush()
    logger.info(
        "backfill of %r %s..%s by %s: %d slots, %d new runs",
        task.name, since.isoformat(), until.isoformat(), requested_by or "-", seen, created,
        extra={"action": "backfill"},
    )
    return _backfill_progress(seen, created, last, since, until, done=True)


def _backfill_progress(
    seen: int, created: int, last: datetime | None, since: datetime, until: datetime,
    done: bool = False,
) -> BackfillProgress:
    fraction = 1.0 if done or last is None else (last - since) / (until - since)
    return BackfillProgress(seen, created, last, min(1.0, fraction))


def _insert_backfill(
    task: PeriodicTask, chunk: list[datetime], requested_by: str, using: str
) -> int:
    """Insert the backfill runs of ``chunk`` that do not exist yet; return how many are new."""
    if not chunk:
        return 0
    existing = set(
        Run.objects.using(using)
        .filter(periodic_task=task, trigger=Run.Trigger.BACKFILL, scheduled_for__in=chunk)
        .exclude(status=Run.Status.CANCELLED)
        .values_list("scheduled_for", flat=True)
    )
    missing = [slot for slot in chunk if slot not in existing]
    runs = [
        _planned(
            task,
            slot,
            trigger=Run.Trigger.BACKFILL,
            task_id=slots.task_id_for(task.pk, slot, Run.Trigger.BACKFILL),
            requested_by=requested_by[:150],
        )
        for slot in missing
    ]
    _insert(runs, using)  # a concurrent backfill's rows win; the constraint drops ours
    return len(runs)


# Lost workers -----------------------------------------------------------------------------------

#: ``reason`` of a running run closed because its worker is gone (``close_lost_executions``).
WORKER_LOST = "worker lost"
#: ``reason`` of such a run when its attempt's outcome arrived after all (the process lived on).
LATE_OUTCOME = "outcome recorded after the run was closed as worker lost"

# The advisory lock keys held right now in this database, as the signed 64-bit keys
# ``pg_advisory_lock(bigint)`` was given (pg_locks splits them into classid/objid, objsubid 1),
# and the key of a run's current attempt: ``scheduling.guard.lock_key`` hashed as the guard does.
_HELD_LOCKS = sql.SQL(
    "held AS MATERIALIZED (SELECT (l.classid::bigint << 32) | l.objid::bigint AS key"
    " FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)
_LOCK_FREE = sql.SQL(
    "NOT EXISTS (SELECT 1 FROM held WHERE held.key ="
    " hashtextextended('scheduling.run:' || r.task_id || ':' || r.retries, 0))"
)


class LostExecutions:
    """One replica's memory of running runs seen without their execution lock.

    Maps (run id, executions) to the database time the lock was first seen free. Kept in memory
    by the scheduler (``LedgerScheduler``) across reconcile passes: a restarted replica starts
    afresh, which only delays a close. ``after`` (seconds) is how long the lock must stay free.
    """

    def __init__(self, after: float) -> None:
        self.after = timedelta(seconds=after)
        self.first_seen: dict[tuple[int, int], datetime] = {}


def close_lost_executions(lost: LostExecutions, using: str = "default") -> list[str]:
    """Close running runs whose worker is gone as failed, reason "worker lost"; return task ids.

    Evidence, not a timeout on the run: while a delivery executes, the worker guard holds the
    run's execution lock (a PostgreSQL advisory lock on (task id, ``retries``), on the executing
    process's own session), and the server frees it when that process dies. A run is closed when
    it is ``running``, was started by the guard (``executions`` > 0, so runs of workers without
    the guard are never touched), and its lock has been free in every pass for at least
    ``lost.after`` (``SCHEDULING_WORKER_LOST_AFTER`` seconds). A redelivery that executes it again
    within that time takes the lock again (and bumps ``executions``), so it is left alone. The
    close is one UPDATE that checks the lock again, so a delivery starting meanwhile either wins
    the row first (then nothing is closed) or finds the run failed and is suppressed.

    Two set-based queries per pass, reading ``pg_locks`` once; nothing when no run is running.
    A late outcome of the same attempt still replaces "worker lost" (``record_finished``).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "WITH {held} SELECT r.id, r.executions, clock_timestamp()"
                " FROM scheduling_run r WHERE r.status = 'running' AND r.executions > 0"
                " AND {free}"
            ).format(held=_HELD_LOCKS, free=_LOCK_FREE)
        )
        rows = cursor.fetchall()
    if not rows:
        lost.first_seen.clear()
        return []
    now = rows[0][2]
    seen = {(pk, n): lost.first_seen.get((pk, n), now) for pk, n, _ in rows}
    lost.first_seen = seen
    due = [key for key, since in seen.items() if now - since >= lost.after]
    if not due:
        return []
    error = (
        f"the execution lock was free for {lost.after.total_seconds():g} s or more: the worker "
        "running this attempt died (or lost its database session), and no redelivery started "
        "it again"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "WITH {held} UPDATE scheduling_run AS r SET status = 'failed', reason = %s,"
                " error = %s, finished_at = clock_timestamp()"
                " FROM unnest(%s::bigint[], %s::integer[]) AS v(id, executions)"
                " WHERE r.id = v.id AND r.executions = v.executions AND r.status = 'running'"
                " AND {free} RETURNING r.id, r.executions, r.task_id, r.periodic_task_name"
            ).format(held=_HELD_LOCKS, free=_LOCK_FREE),
            [WORKER_LOST, error, [pk for pk, _ in due], [n for _, n in due]],
        )
        closed = cursor.fetchall()
    for pk, executions, task_id, name in closed:
        lost.first_seen.pop((pk, executions), None)
        logger.error(
            "run %s of %r failed: worker lost (its execution lock was free for %g s)",
            task_id, name, lost.after.total_seconds(), extra={"action": "worker_lost"},
        )
    return [task_id for _, _, task_id, _ in closed]


# Worker side ------------------------------------------------------------------------------------


def record_started(task_id: str, worker: str, using: str = "default") -> bool:
    """Mark the run with ``task_id`` running on ``worker``; return False if no run matched.

    Waits for a claim in progress on the row (bounded by the claim transaction). A run still
    pending after that was published by a replica whose claim then rolled back (it died or was
    stopped before committing): its message is out, so this delivery is its dispatch. The run is
    adopted: recorded as dispatched now, and the task's following slot is planned, as the claim
    would have done. No replica re-publishes it afterwards, since it is no longer pending.
    """
    with transaction.atomic(using=using):
        run = (
            Run.objects.using(using)
            .filter(task_id=task_id)
            .exclude(status=Run.Status.CANCELLED)
            .select_related(*_SCHEDULE_RELATED)
            .select_for_update(of=("self",))
            .first()
        )
        if run is None:
            return False
        fields: dict[str, object] = {
            "status": Run.Status.RUNNING,
            "started_at": ClockTimestamp(),
            "worker": worker[:255],
        }
        adopted = run.status == Run.Status.PENDING
        if adopted:  # one clock read: started and dispatched at the same instant
            now = database_now(using)
            fields.update(
                started_at=now,
                dispatched_at=now,
                reason="adopted by the worker: the publishing replica's claim did not commit",
            )
        Run.objects.using(using).filter(pk=run.pk).update(**fields)
        if adopted:  # after the update: a task has one pending scheduled run at a time
            _plan_after_adoption(run, using)
    return True


def _plan_after_adoption(run: Run, using: str) -> None:
    """Do what the rolled-back claim would have done after publishing ``run``, and log it."""
    logger.warning(
        "adopted run %s of %r: published by a replica that did not commit its claim",
        run.task_id, run.periodic_task_name, extra={"action": "adopt"},
    )
    task = run.periodic_task
    if task is None or run.trigger != Run.Trigger.SCHEDULE:
        return
    update = _TaskUpdate()
    update.ran(run.scheduled_for)
    if task.one_off:
        update.disable = True
    else:
        try:
            nxt = slots.next_run(task, run.scheduled_for)
        except ScheduleError:
            nxt = None  # the reconcile pass records the schedule's error
            note_unplanned({task.pk}, using)
        else:
            update.disable = nxt is None
        if nxt is not None:
            _insert_pending([(task, nxt)], using)
    _update_tasks({task.pk: update}, using)


@dataclass(frozen=True)
class Execution:
    """The guard's decision for one delivery: run the task body or drop the delivery.

    ``tracked`` is False when no run has this task id (the body runs, nothing is recorded).
    ``reason`` says why (logged, and kept on the run for re-executions).
    """

    execute: bool
    tracked: bool
    reason: str
    run_id: int | None = None


def begin_execution(
    task_id: str,
    worker: str,
    *,
    retries: int,
    redelivered: bool,
    exclusive: bool,
    using: str = "default",
) -> Execution:
    """Decide, in one transaction on the run row, whether this delivery of ``task_id`` executes.

    ``retries`` is Celery's ``request.retries`` of the delivery, ``redelivered`` the broker's flag
    (``delivery_info["redelivered"]``), and ``exclusive`` whether the caller got the run's
    execution lock for this attempt (``scheduling.guard``: a PostgreSQL advisory lock held by the
    executing process's own session for as long as the body runs, so the server frees it when that
    process dies). The rule, run by run status:

    - pending (published by a replica whose claim rolled back): adopted, executes;
    - dispatched: executes (the first delivery);
    - running: a later Celery retry (``retries`` above the run's) executes; the same attempt
      executes again only with evidence that its worker died mid-task: the broker redelivered the
      message AND the execution lock was free (its holder's database session has ended). Otherwise
      it is a duplicate of an execution on a live worker and is dropped;
    - retrying: only the next attempt (``retries`` above the run's) executes;
    - succeeded, failed, expired, skipped, missed, cancelled: dropped (finished).

    Without ``exclusive`` nothing executes: a live process holds this attempt's lock. An executing
    delivery sets running, ``started_at``, ``worker``, ``retries`` and adds one to ``executions``;
    a dropped one adds one to ``suppressed``. Database errors propagate (the guard requeues).
    """
    with transaction.atomic(using=using):
        run = (
            Run.objects.using(using)
            .filter(task_id=task_id)
            .select_related(*_SCHEDULE_RELATED)
            .annotate(db_now=ClockTimestamp())
            .select_for_update(of=("self",))
            # A live run first; a cancelled one only when no other has this task id.
            .order_by(
                Case(
                    When(status=Run.Status.CANCELLED, then=1),
                    default=0,
                    output_field=IntegerField(),
                ),
                "-pk",
            )
            .first()
        )
        if run is None:
            return Execution(True, False, "no run has this task id")
        reason = _execution_verdict(run, retries, redelivered, exclusive)
        if reason is None:
            Run.objects.using(using).filter(pk=run.pk).update(
                suppressed=F("suppressed") + 1
            )
            return Execution(False, True, _suppressed_reason(run, exclusive), run.pk)
        fields: dict[str, object] = {
            "status": Run.Status.RUNNING,
            "started_at": ClockTimestamp(),
            "worker": worker[:255],
            "retries": retries,
            "executions": F("executions") + 1,
        }
        adopted = run.status == Run.Status.PENDING
        if adopted:  # one clock read: started and dispatched at the same instant
            now = database_now(using)
            fields.update(started_at=now, dispatched_at=now, reason=reason)
        elif run.status == Run.Status.RUNNING and retries == run.retries:
            fields["reason"] = reason
        Run.objects.using(using).filter(pk=run.pk).update(**fields)
        if adopted:  # after the update: a task has one pending scheduled run at a time
            _plan_after_adoption(run, using)
    return Execution(True, True, reason, run.pk)


def _execution_verdict(run: Run, retries: int, redelivered: bool, exclusive: bool) -> str | None:
    """Return why this delivery executes, or None to drop it (rule in ``begin_execution``)."""
    if not exclusive:
        return None
    status = run.status
    if status == Run.Status.PENDING:
        return "adopted by the worker: the publishing replica's claim did not commit"
    if status == Run.Status.DISPATCHED:
        return "first delivery"
    if status in (Run.Status.RUNNING, Run.Status.RETRYING) and retries > run.retries:
        return f"Celery retry {retries}"
    if status == Run.Status.RUNNING and retries == run.retries and redelivered:
        return "re-executed: redelivered, and the worker that ran it is gone"
    return None


def _suppressed_reason(run: Run, exclusive: bool) -> str:
    if not exclusive:
        return "running on a live worker"
    if run.status in Run.FINAL_STATUSES:
        return f"already {run.status}"
    return f"duplicate of a {run.status} run (attempt {run.retries})"


def record_finished(
    task_id: str,
    status: str,
    error: str = "",
    *,
    retries: int | None = None,
    using: str = "default",
) -> bool:
    """Record the final ``status`` (succeeded or failed) and a short error text on the run.

    With ``retries`` (the finishing attempt's ``request.retries``), only that attempt's outcome is
    recorded, so a late signal of an earlier attempt cannot overwrite a later one. A run closed as
    "worker lost" takes the outcome of its attempt if that attempt did finish after all.
    """
    runs = (
        Run.objects.using(using)
        .filter(task_id=task_id)
        .exclude(status__in=(Run.Status.CANCELLED, Run.Status.PENDING, *Run.FINAL_STATUSES))
        # the worker was only thought lost (its lock session ended, it did not): the real outcome
        | Run.objects.using(using).filter(
            task_id=task_id, status=Run.Status.FAILED, reason=WORKER_LOST
        )
    )
    if retries is not None:
        runs = runs.filter(retries=retries)
    reason = Case(
        When(reason=WORKER_LOST, then=Value(LATE_OUTCOME)), default=F("reason"),
        output_field=TextField(),
    )
    return bool(
        runs.update(
            status=status, finished_at=ClockTimestamp(), error=error[:_ERROR_LIMIT], reason=reason
        )
    )


def record_retry(
    task_id: str, error: str = "", *, retries: int | None = None, using: str = "default"
) -> bool:
    """Mark the run retrying (a Celery retry of the same run is on its way).

    ``retries`` is the retrying attempt's ``request.retries``: when the next attempt already
    started (its message can overtake this signal), the run is left running.
    """
    runs = Run.objects.using(using).filter(task_id=task_id, status=Run.Status.RUNNING)
    if retries is not None:
        runs = runs.filter(retries=retries)
    return bool(runs.update(status=Run.Status.RETRYING, error=error[:_ERROR_LIMIT]))


def record_not_executed(task_id: str, status: str, reason: str, error: str = "",
                        using: str = "default") -> bool:
    """Close a run whose message a worker dropped before executing it; return True if one was.

    Used for an expired message (``status`` expired), a revoked one and a task name the worker
    does not know (failed). Only a run not yet started (pending or dispatched) is closed: a
    duplicate message dropped while the run executes elsewhere leaves it alone.
    """
    return bool(
        Run.objects.using(using)
        .filter(task_id=task_id, status__in=(Run.Status.PENDING, Run.Status.DISPATCHED))
        .update(
            status=status, reason=reason, error=error[:_ERROR_LIMIT], finished_at=ClockTimestamp()
        )
    )


# Prune ------------------------------------------------------------------------------------------

#: The runs a prune plan deletes (parameters: final, cutoff, keep, names, slots, ids). A task's
#: kept runs are its ``keep`` most recent finished runs: those at or after (slot, id) of the
#: keep-th one; a task without such a row (fewer finished runs) keeps them all.
_PRUNABLE = sql.SQL(
    " FROM scheduling_run r"
    " LEFT JOIN unnest(%(names)s::text[], %(slots)s::timestamptz[], %(ids)s::bigint[])"
    " AS k(name, slot, id) ON k.name = r.periodic_task_name"
    " WHERE r.status = ANY(%(final)s) AND COALESCE(r.finished_at, r.scheduled_for) < %(cutoff)s"
    " AND (%(keep)s = 0 OR (r.scheduled_for, r.id) < (k.slot, k.id))"
)


@dataclass(frozen=True)
class PrunePlan:
    """What a prune deletes: finished runs that finished before ``cutoff`` (aware, UTC), except
    each task's ``keep_last`` most recent finished runs.

    Runs are grouped into tasks by ``periodic_task_name`` (it survives deleting the task) and
    ordered by (scheduled_for, id). ``kept_from`` holds, per task with more than ``keep_last``
    finished runs, the (name, scheduled_for, id) of its ``keep_last``-th most recent one. Runs
    finished after the plan was made are newer, so every task keeps at least ``keep_last``.
    """

    cutoff: datetime
    keep_last: int
    kept_from: list[tuple[str, datetime, int]]

    def params(self) -> dict[str, object]:
        return {
            "final": [str(status) for status in Run.FINAL_STATUSES],
            "cutoff": self.cutoff,
            "keep": self.keep_last,
            "names": [name for name, _, _ in self.kept_from],
            "slots": [slot for _, slot, _ in self.kept_from],
            "ids": [pk for _, _, pk in self.kept_from],
        }


def prune_plan(older_than: timedelta, keep_last: int = 0, using: str = "default") -> PrunePlan:
    """Plan a prune of finished runs older than ``older_than`` before the database clock.

    Age is counted from ``finished_at`` (``scheduled_for`` for a finished run without one). One
    read of the finished runs, no lock. Raises ValueError for a negative ``keep_last``.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must be 0 or more, not {keep_last}")
    cutoff = database_now(using) - older_than
    kept_from: list[tuple[str, datetime, int]] = []
    if keep_last:
        ranked = Run.objects.using(using).finished().annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("periodic_task_name")],
                order_by=[F("scheduled_for").desc(), F("pk").desc()],
            )
        )
        kept_from = list(
            ranked.filter(rank=keep_last).values_list("periodic_task_name", "scheduled_for", "pk")
        )
    return PrunePlan(cutoff, keep_last, kept_from)


def prune_counts(plan: PrunePlan, using: str = "default") -> dict[str, int]:
    """Return how many runs ``plan`` deletes now, per status (what a dry run reports)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            sql.SQL("SELECT r.status, count(*){} GROUP BY r.status ORDER BY r.status").format(
                _PRUNABLE
            ),
            plan.params(),
        )
        return dict(cursor.fetchall())


def prune_batch(
    plan: PrunePlan, after_id: int = 0, batch_size: int = 1000, using: str = "default"
) -> tuple[dict[str, int], int | None]:
    """Delete up to ``batch_size`` runs of ``plan`` with ids above ``after_id``, in id order.

    One short transaction that locks only the rows it deletes (finished runs, which no claim
    wants), skipping any row locked by someone else. Returns the deleted runs per status and the
    highest deleted id (the next batch's ``after_id``), or None when nothing was left.
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(
            sql.SQL(
                "DELETE FROM scheduling_run WHERE id IN (SELECT r.id{}"
                " AND r.id > %(after)s ORDER BY r.id LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED)"
                " RETURNING id, status"
            ).format(_PRUNABLE),
            {**plan.params(), "after": after_id, "limit": batch_size},
        )
        rows = cursor.fetchall()
    counts: dict[str, int] = {}
    for _, status in rows:
        counts[status] = counts.get(status, 0) + 1
    return counts, max((pk for pk, _ in rows), default=None)


def prune(
    plan: PrunePlan,
    *,
    batch_size: int = 1000,
    progress: Callable[[int], None] | None = None,
    using: str = "default",
) -> dict[str, int]:
    """Delete every run of ``plan`` in batches of ``batch_size`` (``prune_batch``); return counts.

    ``progress(n)`` is called after each batch with the number of runs it deleted.
    """
    total: dict[str, int] = {}
    after: int | None = 0
    while after is not None:
        counts, after = prune_batch(plan, after, batch_size, using)
        for status, n in counts.items():
            total[status] = total.get(status, 0) + n
        if progress is not None and counts:
            progress(sum(counts.values()))
    if total:
        logger.info(
            "pruned %d finished runs older than %s (keeping %d per task): %s",
            sum(total.values()), plan.cutoff.isoformat(), plan.keep_last, total,
            extra={"action": "prune"},
        )
    return total
