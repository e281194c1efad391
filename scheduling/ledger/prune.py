"""Prune: delete finished runs older than a cutoff, keeping each task's most recent ones.

In short batches that lock only the rows they delete (finished runs, which no claim wants), so a
prune never holds up a claim. ``manage.py scheduling_prune`` and the built-in prune
(``scheduling.builtin_prune``) call these.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from scheduling.clock import database_now
from scheduling.models import Run
from scheduling.sql import queries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrunePlan:
    """What a prune deletes: runs that finished before ``cutoff`` (aware, UTC), except
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
        cursor.execute(queries["prune_counts"], plan.params())
        return dict(cursor.fetchall())


def prune_batch(
    plan: PrunePlan, after_id: int = 0, batch_size: int = 1000, using: str = "default"
) -> tuple[dict[str, int], int | None]:
    """Delete up to ``batch_size`` runs of ``plan`` with ids above ``after_id``, in id order.

    One short transaction that locks only the rows it deletes (finished runs, which no claim
    wants), skipping any row locked by someone else, committed asynchronously: it does not wait
    for a WAL flush, which on a busy replica the next claim would wait for too (PostgreSQL's
    "Asynchronous Commit"; a crash may undo the last batches, which a later pass deletes). Returns the deleted runs per status and the
    highest deleted id (the next batch's ``after_id``), or None when nothing was left.
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(queries["prune_async_commit"])
        cursor.execute(
            queries["prune_batch"], {**plan.params(), "after": after_id, "limit": batch_size}
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
        logger.debug(  # the command prints the counts; the built-in prune logs its own line
            "pruned %d finished runs older than %s (keeping %d per task): %s",
            sum(total.values()), plan.cutoff.isoformat(), plan.keep_last, total,
            extra={"action": "prune"},
        )
    return total
