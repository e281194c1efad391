"""The claim query: compiled by Django once per connection, sent as a prepared statement.

The Django and psycopg internals of the hot path sit here and nowhere else: a queryset compiled
once (``CompiledClaim``), instances built the way Django's ``ModelIterable`` does, and psycopg's
server-side binding with ``prepare_threshold`` 0 (``prepared``). The query locks due pending runs
with ``SELECT ... FOR UPDATE SKIP LOCKED`` (the claim: it lives as long as the transaction) and
reads the database clock with them (invariant 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import connections
from django.db.models import (
    Case,
    DateTimeField,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.query import get_related_populators

from scheduling.clock import ClockTimestamp, StatementTimestamp
from scheduling.conf import conf
from scheduling.ledger.planning import SCHEDULE_RELATED
from scheduling.ledger.pooler import keeps_prepared
from scheduling.ledger.session import NO_FLOOR
from scheduling.models import Pause, Run, TaskPolicy
from scheduling.sql import compose

#: The floor the claim is compiled with, to find its parameter; each claim passes its own.
_FLOOR_MARK = datetime(1, 1, 1, 0, 0, 0, 424242, tzinfo=UTC)

if TYPE_CHECKING:
    from scheduling.ledger.policy import MisfireDecision


@dataclass
class ClaimedRun:
    """A run locked by a claim, with what the claim query read beside it and decides about it.

    ``db_now`` is the database clock at the claim; ``busy_since`` the newest dispatch of an
    unfinished run of the same task (read for overlap policy skip only); ``pause_id`` the task's
    open pause (``Pause``), None when it is not paused, and ``pause`` that row, loaded by the
    claim for the paused runs only. The claim fills in
    ``load_error`` (its task could not be loaded), ``overlap`` (why overlap policy skips it),
    ``misfire`` (the misfire decision) and ``missed_after`` (slots recorded missed after it).
    """

    run: Run
    db_now: datetime
    busy_since: datetime | None = None
    pause_id: int | None = None
    pause: Pause | None = None
    load_error: str = ""
    overlap: str = ""
    misfire: MisfireDecision | None = None
    missed_after: int = 0


def due(using: str = "default", floor: datetime = NO_FLOOR) -> QuerySet[Run]:
    """Due pending runs in claim order, locked with SKIP LOCKED, with the clock and overlap data.

    Due is ``due_at`` (the slot plus the task's jitter offset) at or before the statement's
    database clock, in ``(due_at, id)`` order: the partial index ``scheduling_run_pending_due``,
    read from ``floor`` on (a replica's ``DueFloor``; by default from its first entry).

    Constants are SQL literals, not parameters, so the prepared statement's generic plan can use
    the partial indexes (a predicate ``status = $1`` cannot prove ``status = 'pending'``).
    """
    return (
        Run.objects.using(using)
        .filter(
            status=literal(Run.Status.PENDING), due_at__gte=floor, due_at__lte=StatementTimestamp()
        )
        .annotate(db_now=ClockTimestamp(), busy_since=_busy_since(), pause_id=_open_pause())
        .order_by("due_at", "pk")
        .select_for_update(skip_locked=True, of=("self",))
    )


def literal(value: str) -> RawSQL:
    """``value`` written into the SQL as a quoted literal (psycopg's quoting), not a parameter."""
    return RawSQL(compose.literal(value), (), output_field=TextField())


class CompiledClaim:
    """The claim query, compiled by Django once per connection and batch size, sent prepared.

    Django compiles a queryset at every evaluation: for this one (seven tables and a subquery)
    that was about 5 ms of CPU per claim, more than the claim's execution for a few runs. The SQL
    and the model layout are kept, and each claim only executes (prepared: ``prepared``) and
    builds the instances the way Django's ModelIterable does.
    """

    def __init__(self, batch_size: int, using: str) -> None:
        queryset = due(using, _FLOOR_MARK).select_related(
            *SCHEDULE_RELATED, "periodic_task__scheduling_policy"
        )[:batch_size]
        self.using = using
        self.compiler = queryset.query.get_compiler(using=using)
        self.sql, params = self.compiler.as_sql()  # also fills select and klass_info
        self.params = list(params)
        (self._floor_at,) = [i for i, p in enumerate(self.params) if p == _FLOOR_MARK]
        info = self.compiler.klass_info
        start, end = info["select_fields"][0], info["select_fields"][-1] + 1
        self.fields = slice(start, end)
        self.names = [column[0].target.attname for column in self.compiler.select[start:end]]
        self.related = get_related_populators(info, self.compiler.select, using)
        self.annotations = self.compiler.annotation_col_map

    @classmethod
    def of(cls, batch_size: int, using: str = "default") -> CompiledClaim:
        """The compiled claim of this batch size on connection ``using`` (compiled on first use)."""
        connection = connections[using]
        cache = connection.__dict__.setdefault("_scheduling_claims", {})
        if batch_size not in cache:
            cache[batch_size] = cls(batch_size, using)
        return cache[batch_size]

    def fetch(self, floor: datetime | None = None) -> list[ClaimedRun]:
        """Execute the claim (in the caller's transaction); return the locked runs.

        ``floor``: the claim's scan starts there (``due``); None: at the first entry."""
        params = self.params.copy()
        params[self._floor_at] = floor or NO_FLOOR
        with prepared(self.using), connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        claimed = []
        now, since = self.annotations["db_now"], self.annotations["busy_since"]
        paused = self.annotations["pause_id"]
        for row in self.compiler.results_iter([rows]):
            run = Run.from_db(self.using, self.names, row[self.fields])
            for populator in self.related:
                populator.populate(row, run)
            claimed.append(
                ClaimedRun(run, db_now=row[now], busy_since=row[since], pause_id=row[paused])
            )
        return claimed


@contextmanager
def prepared(using: str = "default") -> Iterator[None]:
    """Send the body's queries as server-side prepared statements, when psycopg 3 is in use.

    Django binds parameters on the client, so PostgreSQL plans every statement anew: for the
    claim query (seven tables and the overlap subquery) planning took about 4 ms, several times
    its execution, at every claim. Here the body runs on psycopg's server-side binding cursor with
    ``prepare_threshold`` 0: the statement is prepared once per session and then only executed.
    The body must send the same statements every time (not savepoints, whose names change), or
    it fills psycopg's cache of prepared statements. Behind a pooler the statements are prepared
    only when it keeps them per client (``pooler.keeps_prepared``: PgBouncer 1.21+ with
    ``max_prepared_statements``; before that a statement prepared in one transaction is missing
    from the server session lent for the next). ``SCHEDULING_PREPARED_CLAIM = False`` turns this
    off.
    """
    raw = connections[using].connection
    if (
        not conf.prepared_claim
        or not hasattr(raw, "prepare_threshold")
        or not keeps_prepared(using)
    ):
        yield  # psycopg 2, turned off, or a pooler that does not keep them
        return
    from django.db.backends.postgresql.base import ServerBindingCursor

    factory, threshold = raw.cursor_factory, raw.prepare_threshold
    raw.cursor_factory, raw.prepare_threshold = ServerBindingCursor, 0
    try:
        yield
    finally:
        raw.cursor_factory, raw.prepare_threshold = factory, threshold


def _busy_since() -> Case:
    """The newest dispatch time of an unfinished run of the row's task, for overlap skip only."""
    unfinished = Run.objects.filter(
        _any_status(Run.UNFINISHED_STATUSES), periodic_task=OuterRef("periodic_task")
    ).order_by(F("dispatched_at").desc(nulls_last=True))
    return Case(
        When(
            periodic_task__scheduling_policy__overlap_policy=literal(TaskPolicy.Overlap.SKIP),
            then=Subquery(unfinished.values("dispatched_at")[:1]),
        ),
        default=None,
        output_field=DateTimeField(),
    )


def _open_pause() -> Subquery:
    """The id of the row's task's open pause, or NULL (an index probe of the partial unique
    constraint ``scheduling_pause_one_open_per_task``)."""
    open_pause = Pause.objects.filter(
        periodic_task=OuterRef("periodic_task"), resumed_at__isnull=True
    ).order_by()  # at most one row: no sort by the model's ordering
    return Subquery(open_pause.values("id")[:1])


def _any_status(statuses: tuple[str, ...]) -> Q:
    """``status IN (...)`` as literals (``literal``): the partial index's predicate is proven."""
    condition = Q()
    for status in statuses:
        condition |= Q(status=literal(status))
    return condition
