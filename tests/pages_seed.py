"""A ledger and replicas to show on the admin pages, seeded through the models and heartbeats.

Times are relative to the database clock. Runs of the tasks in ``RUNS`` are at least 30 minutes
apart, so each is one mark on the schedule health chart. ``MINUTELY`` ran every minute from 1 to
1,430 minutes ago (``MINUTELY_FAILED`` of them failed): its succeeded runs are drawn as 24
marks, one per hour block of 5-minute buckets (the window ends at the page's own clock), and
each failed run as a mark of its own (they are 10 minutes or more apart).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django_celery_beat.models import IntervalSchedule, PeriodicTask

from scheduling import ledger
from scheduling.models import Replica, Run
from scheduling.replicas import Heartbeat

#: Names with markup: the pages must show them as text.
HOURLY = "hourly digest"
SYNC = "sync <b>orders</b> & invoices"
REPORT = "nightly report"
MINUTELY = "every minute"
#: Minutes before now of the failed runs of MINUTELY.
MINUTELY_FAILED = (100, 130, 700)
MINUTELY_RUNS = 1430
XSS_ERROR = "<script>window.pwned = 1</script> boom"

#: Per task, (hours before now, status, lateness in seconds or None, error/reason).
RUNS: dict[str, list[tuple[float, str, float | None, str]]] = {
    HOURLY: [
        *((h, Run.Status.SUCCEEDED, 0.004 * h, "") for h in (23, 20, 17, 14, 11, 8, 5)),
        (2, Run.Status.FAILED, 0.25, XSS_ERROR),
        (0.5, Run.Status.RUNNING, 0.01, ""),
    ],
    SYNC: [
        (22, Run.Status.SUCCEEDED, 1.5, ""),
        (21, Run.Status.MISSED, None, "misfire: beyond the grace period"),
        (20, Run.Status.MISSED, None, "misfire: beyond the grace period"),
        (19, Run.Status.SUCCEEDED, 90.0, ""),
        (12, Run.Status.SKIPPED, None, "the previous run is not finished"),
        (6, Run.Status.CANCELLED, None, "periodic task disabled"),
    ],
    REPORT: [
        (15, Run.Status.SUCCEEDED, 0.002, ""),
        (3, Run.Status.EXPIRED, 0.003, ""),
    ],
}


@dataclass(frozen=True)
class Seeded:
    now: datetime
    tasks: dict[str, PeriodicTask]


def seed_ledger() -> Seeded:
    """Create the three periodic tasks and their runs of ``RUNS``; return them with the time."""
    now = ledger.database_now()
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.HOURS)
    tasks = {
        name: PeriodicTask.objects.create(name=name, task="project.tasks.record", interval=every)
        for name in RUNS
    }
    runs = []
    for name, rows in RUNS.items():
        for hours, status, lateness, text in rows:
            scheduled = now - timedelta(hours=hours)
            dispatched = None if lateness is None else scheduled + timedelta(seconds=lateness)
            failed = status == Run.Status.FAILED
            runs.append(
                Run(
                    periodic_task=tasks[name], periodic_task_name=name, task=tasks[name].task,
                    scheduled_for=scheduled, status=status, task_id=str(uuid.uuid4()),
                    dispatched_at=dispatched, claimed_by="replica-1" if dispatched else "",
                    error=text if failed else "", reason="" if failed else text,
                )
            )
    minutely, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.MINUTES)
    task = tasks[MINUTELY] = PeriodicTask.objects.create(
        name=MINUTELY, task="project.tasks.record", interval=minutely
    )
    for minutes in range(1, MINUTELY_RUNS + 1):
        scheduled = now - timedelta(minutes=minutes)
        failed = minutes in MINUTELY_FAILED
        runs.append(
            Run(
                periodic_task=task, periodic_task_name=MINUTELY, task=task.task,
                scheduled_for=scheduled, task_id=str(uuid.uuid4()), claimed_by="replica-1",
                status=Run.Status.FAILED if failed else Run.Status.SUCCEEDED,
                dispatched_at=scheduled + timedelta(milliseconds=5), error="ZeroDivisionError"
                if failed else "",
            )
        )
    Run.objects.bulk_create(runs)
    return Seeded(now, tasks)


def seed_replicas() -> None:
    """Three replicas through real heartbeats: one live, one stale (no tick for 10 min), one
    stopped cleanly."""
    for name in ("replica-live", "replica-stale", "replica-stopped"):
        heartbeat = Heartbeat(name)
        heartbeat.claimed({"replica-live": 7, "replica-stale": 3, "replica-stopped": 2}[name])
        assert heartbeat.beat()
        if name == "replica-stopped":
            heartbeat.stop()
    Replica.objects.filter(pk="replica-stale").update(
        last_tick_at=ledger.database_now() - timedelta(minutes=10)
    )
