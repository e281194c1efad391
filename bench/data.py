"""The benchmark's data: periodic tasks in bulk, runs moved to one instant, historical runs."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.db import connection, transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from scheduling import ledger, slots
from scheduling.models import Run, ScheduleChange

TASK = "project.tasks.record"
GRACE = timedelta(seconds=60)
_CHUNK = 5000


def interval_tasks(
    prefix: str, start: int, stop: int, every: timedelta, **fields: object
) -> list[int]:
    """Create tasks ``<prefix>-<start>`` .. ``<prefix>-<stop - 1>`` on one interval row.

    ``fields`` are extra PeriodicTask fields; a callable value is called with the index. Returns
    the new tasks' ids.
    """
    row, _ = IntervalSchedule.objects.get_or_create(
        every=int(every.total_seconds()), period=IntervalSchedule.SECONDS
    )
    return _create(prefix, start, stop, lambda i: {"interval": row}, fields)


def crontab_tasks(prefix: str, count: int) -> list[int]:
    """Create ``count`` UTC crontab tasks spread over the hour (minute ``i % 60``, any hour)."""
    rows = [
        CrontabSchedule.objects.get_or_create(minute=str(m), hour="*", timezone="UTC")[0]
        for m in range(60)
    ]
    return _create(prefix, 0, count, lambda i: {"crontab": rows[i % 60]}, {})


def _create(prefix, start, stop, schedule, fields) -> list[int]:
    ids: list[int] = []
    for low in range(start, stop, _CHUNK):
        tasks = []
        for i in range(low, min(stop, low + _CHUNK)):
            extra = {k: (v(i) if callable(v) else v) for k, v in fields.items()}
            tasks.append(PeriodicTask(name=f"{prefix}-{i}", task=TASK, **schedule(i), **extra))
        ids.extend(t.pk for t in PeriodicTask.objects.bulk_create(tasks))
    return ids


def plan() -> int:
    """Plan every task's next run (a full reconcile, as a replica does when it starts)."""
    planned = ledger.reconcile(GRACE)
    ScheduleChange.objects.all().delete()  # the creations are planned: nothing left to look at
    with connection.cursor() as cursor:  # what autovacuum does soon after such a bulk load
        cursor.execute("VACUUM ANALYZE scheduling_run")
        cursor.execute("VACUUM ANALYZE django_celery_beat_periodictask")
        # The change log's entries just deleted: every pass reads that table, and a million
        # dead rows made reading it take a second.
        cursor.execute("VACUUM ANALYZE scheduling_schedulechange")
    return planned


def move_pending(task_ids: list[int], at: datetime) -> int:
    """Move the pending scheduled runs of ``task_ids`` to the instant ``at`` (ids re-derived).

    Returns the number of runs moved. One statement, so every run becomes due at once.
    """
    pairs = list(
        Run.objects.pending().scheduled().filter(periodic_task_id__in=task_ids)
        .values_list("pk", "periodic_task_id")
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_run AS r SET scheduled_for = %s, task_id = v.task_id"
            " FROM unnest(%s::bigint[], %s::text[]) AS v(id, task_id) WHERE r.id = v.id",
            [at, [pk for pk, _ in pairs], [slots.task_id_for(t, at) for _, t in pairs]],
        )
    return len(pairs)


def due_at_once(task_ids: list[int], timeout: float) -> tuple[datetime, int]:
    """Make the pending runs of ``task_ids`` due a second from now, at one instant, and wait
    until replicas have claimed them all, or ``timeout`` seconds.

    Returns (the instant, aware UTC; the number of runs moved). Watching is cheap (the pending
    index), so it costs the replicas nothing.
    """
    at, moved = make_due(task_ids)
    wait_claimed(at, timeout)
    return at, moved


def make_due(task_ids: list[int], lead: float = 1.0) -> tuple[datetime, int]:
    """Move the pending runs of ``task_ids`` to one instant ``lead`` seconds from now; return
    (the instant, aware UTC; the number of runs moved)."""
    at = ledger.database_now() + timedelta(seconds=lead)
    return at, move_pending(task_ids, at)


def wait_claimed(at: datetime, timeout: float) -> None:
    """Wait until no pending run is left at ``at``, or ``timeout`` seconds."""
    import time

    waiting = Run.objects.pending().filter(scheduled_for=at)
    deadline = time.monotonic() + timeout
    while waiting.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def clear_ledger() -> int:
    """Delete every run that is not pending, then VACUUM ANALYZE the ledger; return how many.

    What earlier scenarios left: finished runs, and the runs of the scenarios without a worker
    (``scenarios.NO_WORKER``: a delivery deadline of a day), left dispatched with their messages
    deleted with their queue. Left there, a later deployment's replica, with the default
    deadline, re-publishes those into its own queue, 100 a pass, and its worker runs them beside
    the scenario's own (guard_cost counted 4,908 of its 5,000 runs, and 100 strangers, in a full
    run); and a built-in prune pass reads them all in id order before it reaches the runs it may
    delete (day_ledger: 1.2 million of them, lateness p99 1.3 s with the prune on). A scenario
    that measures what a ledger of its own costs starts from this.
    """
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM scheduling_run WHERE status <> 'pending'")
        deleted = cursor.rowcount
        cursor.execute("VACUUM ANALYZE scheduling_run")
    return deleted


def forget_runs(task_ids: list[int]) -> None:
    """Delete every run of ``task_ids`` but the pending ones (between repetitions)."""
    Run.objects.filter(periodic_task_id__in=task_ids).exclude(status=Run.Status.PENDING).delete()


def historical_runs(
    total: int, task_ids: list[int], chunk: int = 250_000, *, start: int = 0, vacuum: bool = True
) -> float:
    """Insert ``total`` finished runs of ``task_ids`` set-based (generate_series); return seconds.

    ``start``: the number of historical runs already inserted, to grow the same history (row
    numbers, so task ids and slots, go on from there). ``vacuum=False`` leaves out the VACUUM
    ANALYZE that otherwise follows, for a caller that inserts in several calls.

    Slots go back one minute per run of a task from a day ago; 97% succeeded, 2% failed, 1%
    cancelled. Task ids are UUID-shaped and ordered by row number (like UUIDv7), so the two
    task id indexes grow at their right edge: random ids made the load several times slower
    and change nothing in the claim and poll plans, which never read those indexes. VACUUM
    ANALYZE follows (what autovacuum does after such a load) unless ``vacuum`` is False.
    """
    import time

    started = time.perf_counter()
    ids = sorted(task_ids)
    base = ledger.database_now() - timedelta(days=1)
    for low in range(start, start + total, chunk):
        high = min(start + total, low + chunk)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO scheduling_run (
                    periodic_task_id, periodic_task_name, task, scheduled_for, trigger, status,
                    reason, task_id, slots, planned_at, claimed_by, dispatched_at, started_at,
                    finished_at, worker, error, requested_by, retries, executions, suppressed,
                    republished)
                SELECT ids[1 + g %% n], 'history-' || (g %% n), %s, s.slot, 'schedule',
                    CASE WHEN g %% 100 < 97 THEN 'succeeded'
                         WHEN g %% 100 < 99 THEN 'failed' ELSE 'cancelled' END,
                    '', lpad(to_hex(g), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g), 12, '0'),
                    1, s.slot, 'bench:history',
                    s.slot + interval '5 ms', s.slot + interval '20 ms',
                    s.slot + interval '120 ms', 'bench-worker', '', '', 0, 1, 0, 0
                FROM generate_series(%s::bigint, %s::bigint) AS g,
                    LATERAL (SELECT %s::int[] AS ids, %s::int AS n) AS c,
                    LATERAL (SELECT %s::timestamptz - (g / n + 1) * interval '1 minute' AS slot)
                        AS s
                """,
                [TASK, low, high - 1, ids, len(ids), base],
            )
    if vacuum:
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE scheduling_run")
    return time.perf_counter() - started


def edit_one(task_ids: list[int], rng: random.Random) -> None:
    """Move one crontab task to another minute, the way the admin saves it (``save()``)."""
    task = PeriodicTask.objects.get(pk=rng.choice(task_ids))
    minute = (int(task.crontab.minute) + 1 + rng.randrange(58)) % 60
    task.crontab = CrontabSchedule.objects.get(minute=str(minute), hour="*", timezone="UTC")
    task.save()
