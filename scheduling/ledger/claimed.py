"""The claim statement's rows as claimed runs: what the claim reads, and nothing more.

The statement is ``queries["claim"]`` (``scheduling/sql/queries.sql``): due pending runs locked
with ``SELECT ... FOR UPDATE SKIP LOCKED`` (the claim: it lives as long as the transaction), the
database clock (invariant 5), and each run's task, schedule, policy and definition version. A
row becomes one ``ClaimedRun`` (the run's columns the claim reads and writes, and its working
state) and, once per task in a claim, one ``ClaimedTask``: tuples, not model instances. A
claimed task has the attributes of a ``PeriodicTask`` with its schedule, ``scheduling_policy``
and ``scheduling_version`` loaded that ``slots``, ``ledger.policy``, ``messages`` and
``ledger.writes`` read, by the same names, so those pure functions take either. Building model
instances per row (every column, Django's converters, the related objects' caches) was most of
a claim's CPU in Python.

The statement is sent prepared (``prepared``): planned once per session, then only executed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, NamedTuple
from zoneinfo import ZoneInfo

import psycopg
from django.db import connections

from scheduling.conf import conf
from scheduling.ledger.pooler import keeps_prepared
from scheduling.ledger.session import NO_FLOOR
from scheduling.models import Pause, Run
from scheduling.sql import queries

if TYPE_CHECKING:
    from scheduling.ledger.policy import MisfireDecision


class Interval(NamedTuple):
    """An ``IntervalSchedule``'s columns."""

    every: int
    period: str


class Crontab(NamedTuple):
    """A ``CrontabSchedule``'s columns; ``timezone`` loaded as a zone."""

    minute: str
    hour: str
    day_of_month: str
    month_of_year: str
    day_of_week: str
    timezone: ZoneInfo


class Solar(NamedTuple):
    """A ``SolarSchedule``'s columns (degrees)."""

    event: str
    latitude: Decimal
    longitude: Decimal


class Clocked(NamedTuple):
    """A ``ClockedSchedule``'s column (aware UTC)."""

    clocked_time: datetime


class Policy(NamedTuple):
    """The ``TaskPolicy`` columns the claim reads (seconds; None: the setting's default)."""

    misfire_policy: str
    misfire_grace_seconds: int | None
    catch_up_limit: int
    overlap_policy: str
    overlap_stale_seconds: int | None
    jitter_seconds: int


class Version(NamedTuple):
    """A ``TaskVersion``: the task's definition version, written on the runs planned from it."""

    version: int


class ClaimedTask(NamedTuple):
    """A claimed run's periodic task: ``PeriodicTask``'s columns the claim reads, by their names,
    its schedule (the one of ``interval``, ``crontab``, ``solar``, ``clocked`` its id names; the
    others None), ``scheduling_policy`` (None: no ``TaskPolicy`` row, the defaults apply) and
    ``scheduling_version`` (None: no ``TaskVersion`` row)."""

    pk: int
    name: str
    task: str
    enabled: bool
    one_off: bool
    start_time: datetime | None
    expires: datetime | None
    expire_seconds: int | None
    last_run_at: datetime | None
    total_run_count: int
    date_changed: datetime | None
    args: str
    kwargs: str
    headers: str
    queue: str | None
    exchange: str | None
    routing_key: str | None
    priority: int | None
    interval_id: int | None
    crontab_id: int | None
    solar_id: int | None
    clocked_id: int | None
    interval: Interval | None
    crontab: Crontab | None
    solar: Solar | None
    clocked: Clocked | None
    scheduling_policy: Policy | None
    scheduling_version: Version | None


class ClaimedRun:
    """A run locked by a claim: its columns the claim reads and writes, and its working state.

    Read: ``id``, ``periodic_task_id``, ``periodic_task_name``, ``trigger``, ``scheduled_for``,
    ``due_at``, ``task_id``; written back (``ledger.writes.update_runs``): ``status``,
    ``reason``, ``slots``, ``claimed_by``, ``dispatched_at``, ``error``, ``finished_at``,
    ``buffered_at`` (set: a buffered run, or one released to pending again). ``db_now`` is the
    database clock at the claim; ``busy_since`` the newest dispatch of an unfinished run of the
    same task (read for overlap policies skip and buffer_one only); ``waiting`` whether the task
    has a buffered run (buffer_one only; None otherwise); ``pause_id`` the task's
    open pause (``Pause``), None when it is not paused, and ``pause`` that row, loaded by the
    claim for the paused runs only. ``periodic_task`` is None when the task was deleted. The
    claim fills in ``load_error`` (the task's schedule cannot be loaded), ``misfire`` (the
    misfire policy's decision, from ``decision.Decision``) and ``missed_after`` (slots
    recorded missed after it).
    """

    # The first 18 in the statement's column order (``COLUMNS``), then the working state.
    __slots__ = (  # noqa: RUF023
        "id", "periodic_task_id", "periodic_task_name", "trigger", "scheduled_for", "due_at",
        "task_id", "reason", "slots", "claimed_by", "dispatched_at", "error", "finished_at",
        "buffered_at", "db_now", "busy_since", "waiting", "pause_id", "status", "periodic_task",
        "pause", "load_error", "misfire", "missed_after",
    )

    def __init__(self, row: Sequence[object], task: ClaimedTask | None, load_error: str) -> None:
        (
            self.id, self.periodic_task_id, self.periodic_task_name, self.trigger,
            self.scheduled_for, self.due_at, self.task_id, self.reason, self.slots,
            self.claimed_by, self.dispatched_at, self.error, self.finished_at, self.buffered_at,
            self.db_now, self.busy_since, self.waiting, self.pause_id,
        ) = row[:_TASK]
        self.status: str = Run.Status.PENDING
        self.periodic_task = task
        self.pause: Pause | None = None
        self.load_error = load_error
        self.misfire: MisfireDecision | None = None
        self.missed_after = 0

    @property
    def pk(self) -> int:
        """The run's id (as on a ``Run``)."""
        return self.id

    @property
    def lateness(self) -> timedelta | None:
        """dispatched_at - due_at (``Run.lateness``), or None before dispatch."""
        if self.dispatched_at is None:
            return None
        return self.dispatched_at - (self.due_at or self.scheduled_for)


#: Where each part of a row starts: the run's columns, the clock and the three subqueries (18),
#: the task's own columns, then each schedule's, the policy's and the version.
_TASK = 18
_INTERVAL = _TASK + len(ClaimedTask._fields) - 6
_CRONTAB = _INTERVAL + len(Interval._fields)
_SOLAR = _CRONTAB + len(Crontab._fields)
_CLOCKED = _SOLAR + len(Solar._fields)
_POLICY = _CLOCKED + len(Clocked._fields)
_VERSION = _POLICY + len(Policy._fields)
#: The statement's columns, in order: what ``ClaimedRun`` and ``ClaimedTask`` read.
COLUMNS = (
    *ClaimedRun.__slots__[:_TASK], *ClaimedTask._fields[:-6], *Interval._fields,
    *Crontab._fields, *Solar._fields, *Clocked._fields, *Policy._fields, *Version._fields,
)


def claim_rows(batch_size: int, using: str = "default", floor: datetime | None = None) -> list:
    """Execute the claim statement (in the caller's transaction); return its rows as fetched.

    ``floor``: the scan starts there (the replica's ``DueFloor``); None: at the first entry.
    """
    params = {"floor": floor or NO_FLOOR, "limit": batch_size}
    with prepared(using), connections[using].cursor() as cursor:
        cursor.execute(queries["claim"], params)
        return cursor.fetchall()


def claimed_runs(rows: list) -> list[ClaimedRun]:
    """Turn the claim statement's rows into claimed runs, each task built once.

    A task whose schedule cannot be loaded (an unknown time zone written by raw SQL, say) gives
    its runs a ``load_error`` and no task; the others are not affected (invariant 7).
    """
    tasks: dict[int, ClaimedTask | str] = {}
    claimed = []
    for row in rows:
        pk = row[_TASK]
        task: ClaimedTask | str | None = None
        if pk is not None:
            task = tasks.get(pk)
            if task is None:
                task = tasks[pk] = _task(row)
        if isinstance(task, str):
            claimed.append(ClaimedRun(row, None, task))
        else:
            claimed.append(ClaimedRun(row, task, ""))
    return claimed


def _task(row: Sequence) -> ClaimedTask | str:
    """The row's task, or why its schedule cannot be loaded."""
    interval = crontab = solar = clocked = None
    if row[_INTERVAL] is not None:  # each schedule's first column is NOT NULL: a row joined
        interval = Interval(*row[_INTERVAL:_CRONTAB])
    if row[_CRONTAB] is not None:
        try:
            zone = ZoneInfo(row[_SOLAR - 1])
        except (ValueError, LookupError) as exc:
            return f"cannot load the periodic task or its schedule: {exc}"
        crontab = Crontab(*row[_CRONTAB : _SOLAR - 1], zone)
    if row[_SOLAR] is not None:
        solar = Solar(*row[_SOLAR:_CLOCKED])
    if row[_CLOCKED] is not None:
        clocked = Clocked(row[_CLOCKED])
    policy = Policy(*row[_POLICY:_VERSION]) if row[_POLICY] is not None else None
    version = Version(row[_VERSION]) if row[_VERSION] is not None else None
    return ClaimedTask(*row[_TASK:_INTERVAL], interval, crontab, solar, clocked, policy, version)


@contextmanager
def prepared(using: str = "default") -> Iterator[None]:
    """Send the body's queries as server-side prepared statements, when psycopg 3 is in use.

    Django binds parameters on the client, so PostgreSQL plans every statement anew: for the
    claim (eight tables and two subqueries) planning took about 4 ms, several times its
    execution, at every claim. Here the body's cursors are psycopg's server-side binding ones
    with ``prepare_threshold`` 0: the statement is prepared once per session and then only
    executed. The body must send the same statements every time (not savepoints, whose names
    change), or it fills psycopg's cache of prepared statements. Behind a pooler the statements
    are prepared only when it keeps them per client (``pooler.keeps_prepared``: PgBouncer 1.21+
    with ``max_prepared_statements``; before that a statement prepared in one transaction is
    missing from the server session lent for the next). ``SCHEDULING_PREPARED_CLAIM = False``
    turns this off.
    """
    raw = connections[using].connection
    if (
        not conf.prepared_claim
        or not isinstance(raw, psycopg.Connection)
        or not keeps_prepared(using)
    ):
        yield  # psycopg 2, turned off, or a pooler that does not keep them
        return
    factory, threshold = raw.cursor_factory, raw.prepare_threshold
    raw.cursor_factory, raw.prepare_threshold = psycopg.Cursor, 0
    try:
        yield
    finally:
        raw.cursor_factory, raw.prepare_threshold = factory, threshold
