"""The claim statement's rows as claimed runs: what the claim reads, and nothing more.

The statement is ``queries["claim"]`` (``scheduling/sql/queries.sql``): due pending runs locked
with ``SELECT ... FOR UPDATE SKIP LOCKED`` (the claim: it lives as long as the transaction), the
database clock (invariant 5), and each run's task, schedule, policy and definition version. A
row becomes one ``ClaimedRun`` (the run's columns the claim reads and writes, and its working
state) and, once per task in a claim, one ``ClaimedTask``: tuples, not model instances. Each
is read by column name: the statement's column names (its aliases) are the attributes, looked
up once per process in the cursor's description (``RowLayout``). A
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
from functools import cache
from operator import itemgetter
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
    buffer_limit: int
    replace_started: str


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
    same task (read for the overlap policies other than allow); ``waiting`` how many other runs
    of the task wait, buffered or released (the policies of ``TaskPolicy.BUFFERING``; None otherwise);
    ``pause_id`` the task's
    open pause (``Pause``), None when it is not paused, and ``pause`` that row, loaded by the
    claim for the paused runs only. ``periodic_task`` is None when the task was deleted. The
    claim fills in ``load_error`` (the task's schedule cannot be loaded), ``misfire`` (the
    misfire policy's decision, from ``decision.Decision``), ``missed_after`` (slots
    recorded missed after it) and ``replaced`` (the runs it ended under overlap policy replace).
    """

    #: The statement's columns a claimed run reads, by name; then its working state.
    READ = (
        "id", "periodic_task_id", "periodic_task_name", "trigger", "scheduled_for", "due_at",
        "task_id", "reason", "slots", "claimed_by", "dispatched_at", "error", "finished_at",
        "buffered_at", "db_now", "busy_since", "waiting", "pause_id",
    )
    __slots__ = (  # noqa: RUF023
        *READ, "status", "periodic_task", "pause", "load_error", "misfire", "missed_after",
        "replaced",
    )

    def __init__(self, values: Sequence[object], task: ClaimedTask | None, load_error: str) -> None:
        """``values``: the row's ``READ`` columns, in that order."""
        (
            self.id, self.periodic_task_id, self.periodic_task_name, self.trigger,
            self.scheduled_for, self.due_at, self.task_id, self.reason, self.slots,
            self.claimed_by, self.dispatched_at, self.error, self.finished_at, self.buffered_at,
            self.db_now, self.busy_since, self.waiting, self.pause_id,
        ) = values
        self.status: str = Run.Status.PENDING
        self.periodic_task = task
        self.pause: Pause | None = None
        self.load_error = load_error
        self.misfire: MisfireDecision | None = None
        self.missed_after = 0
        self.replaced = 0

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


#: The statement's name for each ``ClaimedTask`` column of the task row itself (the others are
#: built from their own records); its id is ``pk``, as on the model.
_TASK_OWN = ClaimedTask._fields[: ClaimedTask._fields.index("interval")]
_RECORDS = {"interval": Interval, "crontab": Crontab, "solar": Solar, "clocked": Clocked,
            "scheduling_policy": Policy, "scheduling_version": Version}


class RowLayout(NamedTuple):
    """Where a claim row's columns are, found by their names: one getter per record.

    Each getter (``operator.itemgetter``) returns the record's fields from a row, in the record's
    order; ``task_pk`` and ``present`` (the first column of each schedule, policy and version
    record, NOT NULL when a row was joined) are single positions.
    """

    run: itemgetter
    task: itemgetter
    records: dict[str, itemgetter]
    task_pk: int
    present: dict[str, int]

    @classmethod
    def of(cls, names: Sequence[str]) -> RowLayout:
        """The layout of a row whose columns are ``names``; ValueError naming a missing column."""
        index = {name: i for i, name in enumerate(names)}
        wanted = [*ClaimedRun.READ, *_TASK_OWN,
                  *(f for record in _RECORDS.values() for f in record._fields)]
        missing = [name for name in wanted if name not in index]
        if missing:
            raise ValueError(f"the claim statement has no column {', '.join(missing)}")

        def getter(fields: Sequence[str]) -> itemgetter:
            return itemgetter(*(index[f] for f in fields))

        return cls(
            run=getter(ClaimedRun.READ), task=getter(_TASK_OWN),
            records={name: getter(record._fields) for name, record in _RECORDS.items()},
            task_pk=index["pk"],
            present={name: index[record._fields[0]] for name, record in _RECORDS.items()},
        )


def claim_rows(
    batch_size: int, using: str = "default", floor: datetime | None = None
) -> tuple[list, RowLayout]:
    """Execute the claim statement (in the caller's transaction); return its rows as fetched and
    where their columns are.

    ``floor``: the scan starts there (the replica's ``DueFloor``); None: at the first entry.
    """
    params = {"floor": floor or NO_FLOOR, "limit": batch_size}
    with prepared(using), connections[using].cursor() as cursor:
        cursor.execute(queries["claim"], params)
        names = tuple(column.name for column in cursor.description)
        return cursor.fetchall(), _layout_of(names)


@cache
def _layout_of(names: tuple[str, ...]) -> RowLayout:
    """``RowLayout.of(names)``, found once per process for the statement's columns."""
    return RowLayout.of(names)


def claimed_runs(rows: list, layout: RowLayout) -> list[ClaimedRun]:
    """Turn the claim statement's rows into claimed runs, each task built once.

    A task whose schedule cannot be loaded (an unknown time zone written by raw SQL, say) gives
    its runs a ``load_error`` and no task; the others are not affected (invariant 7).
    """
    tasks: dict[int, ClaimedTask | str] = {}
    claimed = []
    for row in rows:
        pk = row[layout.task_pk]
        task: ClaimedTask | str | None = None
        if pk is not None:
            task = tasks.get(pk)
            if task is None:
                task = tasks[pk] = _task(row, layout)
        if isinstance(task, str):
            claimed.append(ClaimedRun(layout.run(row), None, task))
        else:
            claimed.append(ClaimedRun(layout.run(row), task, ""))
    return claimed


def _task(row: Sequence, layout: RowLayout) -> ClaimedTask | str:
    """The row's task, or why its schedule cannot be loaded."""
    records: dict[str, object] = {}
    for name, record in _RECORDS.items():
        values = None
        if row[layout.present[name]] is not None:
            got = layout.records[name](row)
            values = got if isinstance(got, tuple) else (got,)
        records[name] = values
    crontab = records["crontab"]
    if crontab is not None:
        try:
            records["crontab"] = (*crontab[:-1], ZoneInfo(crontab[-1]))
        except (ValueError, LookupError) as exc:
            return f"cannot load the periodic task or its schedule: {exc}"
    return ClaimedTask(
        *layout.task(row),
        **{name: None if values is None else _RECORDS[name]._make(values)
           for name, values in records.items()},
    )


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
