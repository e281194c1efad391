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


#: A task with 95 succeeded runs and 1 pending one in one 15-minute bucket (of the last hour).
BUSY = "busy quarter"
BUSY_SUCCEEDED = 95
#: A task with runs of every window's range, several in one minute, manual and backfill ones.
PROBE = "windows probe"
#: Replica and worker ids as a deployment has them (hostname:pid): long, and never wrapped.
REPLICA_ID = "app-7f9c2d1e8b-xk2lp.scheduling.svc.cluster.local:48213"
WORKER_ID = "celery@worker-5d8f7c9b6d-q4hzt.scheduling.svc.cluster.local"
#: Per run of PROBE: (minutes before the seeding minute, seconds into that minute, trigger,
#: status, lateness in seconds or None). 8 days back is outside every window.
PROBE_RUNS: list[tuple[int, int, str, str, float | None]] = [
    (0, 0, Run.Trigger.SCHEDULE, Run.Status.PENDING, None),
    (3, 10, Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED, 0.2),
    (3, 20, Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED, 0.4),
    (3, 30, Run.Trigger.SCHEDULE, Run.Status.FAILED, 0.3),
    (3, 40, Run.Trigger.BACKFILL, Run.Status.SUCCEEDED, 5000.0),
    (20, 5, Run.Trigger.SCHEDULE, Run.Status.MISSED, None),
    (20, 15, Run.Trigger.MANUAL, Run.Status.RUNNING, 0.1),
    (50, 0, Run.Trigger.SCHEDULE, Run.Status.CANCELLED, None),
    (180, 0, Run.Trigger.SCHEDULE, Run.Status.SKIPPED, None),
    (181, 0, Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED, 2.5),
    (20 * 60, 0, Run.Trigger.SCHEDULE, Run.Status.EXPIRED, 0.1),
    (2 * 24 * 60, 0, Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED, 0.1),
    (6 * 24 * 60, 30, Run.Trigger.BACKFILL, Run.Status.FAILED, 9000.0),
    (8 * 24 * 60, 0, Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED, 0.1),
]


@dataclass(frozen=True)
class SeededRun:
    task: str
    scheduled_for: datetime
    trigger: str
    status: str


def seed_windows() -> list[SeededRun]:
    """Create ``BUSY`` and ``PROBE`` with their runs; return every run created.

    Times are whole seconds after a whole minute of the database clock, so runs seeded in one
    minute share a bucket in every window (all steps are whole minutes since the epoch), and
    BUSY's runs are in the last whole 15-minute bucket before the current one.
    """
    now = ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.MINUTES)
    busy = PeriodicTask.objects.create(name=BUSY, task="project.tasks.record", interval=every)
    probe = PeriodicTask.objects.create(name=PROBE, task="project.tasks.record", interval=every)
    quarter = minute.replace(minute=minute.minute // 15 * 15) - timedelta(minutes=15)
    plan: list[tuple[PeriodicTask, datetime, str, str, float | None]] = [
        (busy, quarter + timedelta(seconds=9 * i), Run.Trigger.SCHEDULE, Run.Status.SUCCEEDED,
         0.004)
        for i in range(BUSY_SUCCEEDED)
    ]
    plan.append((busy, quarter + timedelta(seconds=870), Run.Trigger.SCHEDULE,
                 Run.Status.PENDING, None))
    plan += [
        (probe, minute - timedelta(minutes=minutes) + timedelta(seconds=seconds), trigger,
         status, lateness)
        for minutes, seconds, trigger, status, lateness in PROBE_RUNS
    ]
    runs = [
        Run(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=scheduled, trigger=trigger, status=status, task_id=str(uuid.uuid4()),
            dispatched_at=None if lateness is None else scheduled + timedelta(seconds=lateness),
            claimed_by=REPLICA_ID if lateness is not None else "",
            worker=WORKER_ID if status in Run.FINAL_STATUSES and lateness is not None else "",
            requested_by="admin" if trigger != Run.Trigger.SCHEDULE else "",
        )
        for task, scheduled, trigger, status, lateness in plan
    ]
    Run.objects.bulk_create(runs)
    return [SeededRun(r.periodic_task_name, r.scheduled_for, r.trigger, r.status) for r in runs]
