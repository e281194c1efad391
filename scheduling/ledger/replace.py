"""Overlap policy replace's writes, in the claim's transaction: the task's unfinished runs ended.

The claim (``scheduling.ledger.claim``) calls ``replace_unfinished`` when ``decision.decide``
says REPLACE, then dispatches the new run or buffers it behind the started runs this returns.
Rules: docs/lifecycle.md, "Overlap policies that wait".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connections

from scheduling.sql import queries


def replace_unfinished(
    task: int,
    claimed: list[int],
    reason: str,
    *,
    terminate: bool,
    stale: timedelta,
    using: str = "default",
) -> tuple[int, list[tuple[str, datetime | None]]]:
    """End the unfinished runs of periodic task ``task`` (its id) for a newer slot.

    The runs not started yet (dispatched, buffered, or released and pending again), other than
    this claim's own (``claimed``, run ids), are skipped with ``reason``: a delivery of one is
    dropped by the worker guard; returns how many, and then, read by a second statement that
    sees a start committed meanwhile, the started ones (running, retrying) dispatched less than
    ``stale`` ago (older ones are taken for lost: ``policy.stale_bound``) as (Celery task id, dispatched_at:
    aware UTC or None), newest dispatch first; with ``terminate`` each gets ``reason`` (the
    caller revokes them after its commit and their outcome keeps it). Must run inside the
    claim's transaction; database errors propagate (the claim rolls back).
    """
    params = {
        "task": task, "claimed": claimed, "reason": reason, "terminate": terminate,
        "stale": stale,
    }
    with connections[using].cursor() as cursor:
        cursor.execute(queries["replace_not_started"], params)
        (ended,) = cursor.fetchone()
        cursor.execute(queries["replace_started"], params)
        started = [(task_id, at) for task_id, at in cursor.fetchall()]
    return ended, sorted(started, key=lambda row: row[1] or _NEVER, reverse=True)


#: Sorts a started run without a dispatch time (written by hand) last.
_NEVER = datetime.min.replace(tzinfo=UTC)
