"""The herd: N tasks due at the same instant, fresh replicas, guarded workers executing them.

For each N (1,000, 3,000 and 10,000; quick: 100) and each kind (clocked one-offs sharing one
clocked time; crontab tasks sharing one minute), a deployment of its own: 3 replicas started
fresh, 2 workers (concurrency 2, the example project's settings: the guard on), then the N
tasks created through the ORM (``bulk_create``) with their instant ``LEAD`` seconds (plus a
second per 1,000 tasks) ahead, planned by the replicas from the change log as any new task is.
A crontab instant is the next whole minute past that lead (a task of minute and hour, so the
instant is its only slot of the day).

Rows: every run once (the ledger: one dispatched run per task at the instant; the broker: one
message per run, no copy; the workers' own log: one execution per run), and the lateness p99 /
max at the ledger (``dispatched_at - due_at``: each run's flush to the broker) and at the broker
(its arrival there - due). The target (issue 35) is max <= 1 s at 3,000 tasks, both ways.

At that size each kind runs a second time with the workers held (SIGSTOP to their process
groups from before the instant until every run is claimed, then SIGCONT: they execute the
herd after): the replicas' own lateness, without the two workers executing the first runs on
the same cores meanwhile. A figure beside the target, not a target.

On Redis the messages are taken off the replicas' queue as they arrive (``env.Arrivals``) and
relayed unchanged to the queue the workers consume; on other brokers the workers consume the
replicas' queue and the broker's row says n/a.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, PeriodicTask

from bench import data, scenarios
from bench.env import Arrivals, cpu_seconds
from bench.profile import profiled
from bench.report import Row, percentile
from scheduling import ledger
from scheduling.models import Run

FULL = (1_000, 3_000, 10_000)
QUICK = (100,)
REPLICAS = ("replica-1", "replica-2", "replica-3")
WORKERS = ("worker-1", "worker-2")
#: Seconds between the tasks' creation and their instant, plus one per 1,000 tasks: the replicas
#: plan them from the change log meanwhile.
LEAD = 8.0
#: The size at which the target applies, and the target (seconds of lateness, max, both ways).
TARGET_SIZE, TARGET_MAX = 3_000, 1.0
#: Executions per second the workers are given at least before the scenario gives up on them.
SLOWEST_RATE = 20.0


@dataclass(frozen=True)
class Outcome:
    """One herd: its lateness (seconds, by task id) at the ledger and at the broker (None when
    the broker cannot tell), and the counts of every run once."""

    kind: str
    size: int
    ledger: list[float]
    broker: list[float] | None
    dispatched: int
    arrived: int
    copies: int
    executed: int
    executed_twice: int
    #: The workers were held until every run was claimed (the replicas' own lateness).
    held: bool = False


def herd(bench) -> list[Row]:
    """Rows of every size and kind; see the module's docstring. ``BENCH_HERD_SIZES`` (comma-
    separated task counts; development) replaces the sizes."""
    sizes = QUICK if bench.sizes == scenarios.QUICK else FULL
    if os.environ.get("BENCH_HERD_SIZES"):
        sizes = tuple(int(n) for n in os.environ["BENCH_HERD_SIZES"].split(","))
    # Earlier scenarios' runs left dispatched with no worker: these replicas (the default delivery
    # deadline) would re-publish them into the herd's queue, for its workers.
    data.clear_ledger()
    rows = []
    for size in sizes:
        for kind in ("clocked", "crontab"):
            rows += _rows(_one_herd(bench, kind, size))
            if size == TARGET_SIZE:
                rows += _rows(_one_herd(bench, kind, size, held=True))
    return rows


def _one_herd(bench, kind: str, size: int, held: bool = False) -> Outcome:
    label = f"herd-{kind}-{size}{'-held' if held else ''}"
    deployment = bench.deployment(label)
    redis = bench.broker.kind == "redis"
    work_queue = f"{deployment.queue}-work" if redis else deployment.queue
    arrivals = Arrivals(bench.broker, deployment.queue, relay=work_queue) if redis else None
    tasks: list[int] = []
    try:
        for name in REPLICAS:
            deployment.start_beat(name)
        for name in WORKERS:
            deployment.kinds[name] = "worker"
            deployment._start(name, [
                "worker", "-l", "info", "-c", "2", "-n", f"{name}@{work_queue}.%h",
                "-Q", work_queue, "--without-gossip", "--without-mingle", "--without-heartbeat",
            ], {})
        deployment.wait_ready(*REPLICAS, *WORKERS, timeout=120)
        if arrivals is not None:
            arrivals.start()
        at, tasks = _create(kind, size)
        pids = [deployment.processes[name].pid for name in REPLICAS]
        _wait_planned(tasks, at, size)
        bench.log(f"  herd {kind} {size:,}: planned, {(at - ledger.database_now()).total_seconds():.1f}"
                  f" s before the instant; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        with profiled(bench.profile, label, pids), _stopped(deployment, WORKERS if held else ()):
            scenarios.sleep_until(at)
            cpu = sum(map(cpu_seconds, pids))
            data.wait_claimed(at, timeout=120)
            cpu = sum(map(cpu_seconds, pids)) - cpu
        bench.log(f"  herd {kind} {size:,}: all claimed {(ledger.database_now() - at).total_seconds():.2f}"
                  f" s after the instant (polled); the replicas' CPU meanwhile {cpu:.2f} s")
        runs = list(Run.objects.filter(periodic_task_id__in=tasks, scheduled_for=at)
                    .values_list("task_id", "due_at", "dispatched_at"))
        _wait_executed(deployment, {task_id for task_id, _, _ in runs}, size)
    finally:
        deployment.stop()
        seen = arrivals.stop() if arrivals is not None else None
        bench.broker.delete(deployment.queue)
        if redis:
            bench.broker.delete(work_queue)
        _forget(tasks)
    return _outcome(kind, size, runs, seen, deployment.executions(), held)


@contextmanager
def _stopped(deployment, names: tuple[str, ...]) -> Iterator[None]:
    """Hold the named processes (``Deployment.send``: SIGSTOP to each one's process group) for
    the block, then let them go on (SIGCONT), whatever happens."""
    for name in names:
        deployment.send(name, signal.SIGSTOP)
    try:
        yield
    finally:
        for name in names:
            deployment.send(name, signal.SIGCONT)


def _create(kind: str, size: int) -> tuple[datetime, list[int]]:
    """Create ``size`` tasks of ``kind`` sharing their instant; return (the instant, their ids)."""
    at = ledger.database_now() + timedelta(seconds=LEAD + size / 1000)
    if kind == "clocked":
        at = at.replace(microsecond=0) + timedelta(seconds=1)
        clocked = ClockedSchedule.objects.create(clocked_time=at)
        schedule = {"clocked": clocked, "one_off": True}
    else:
        at = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
        crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=str(at.minute), hour=str(at.hour), day_of_week="*", day_of_month="*",
            month_of_year="*", timezone="UTC",
        )
        schedule = {"crontab": crontab}
    prefix = f"herd-{kind}-{size}"
    created = PeriodicTask.objects.bulk_create(
        PeriodicTask(name=f"{prefix}-{i}", task=data.TASK, **schedule) for i in range(size)
    )
    return at, [task.pk for task in created]


def _wait_planned(tasks: list[int], at: datetime, size: int) -> None:
    """Wait until the replicas planned every task's run at ``at``; raise if the instant came
    first (the herd would then measure planning, not the claim)."""
    pending = Run.objects.pending().filter(periodic_task_id__in=tasks, scheduled_for=at)
    while pending.count() < size:
        if ledger.database_now() >= at - timedelta(seconds=1):
            raise RuntimeError(f"herd: {pending.count()}/{size} runs planned a second before"
                               f" the instant")
        time.sleep(0.2)


def _wait_executed(deployment, task_ids: set[str], size: int) -> None:
    deadline = time.monotonic() + 60 + size / SLOWEST_RATE
    while time.monotonic() < deadline:
        done = {e["task_id"] for e in deployment.executions()} & task_ids
        if len(done) >= len(task_ids):
            time.sleep(1.0)  # a duplicate execution would show by now
            return
        time.sleep(0.5)


def _forget(tasks: list[int]) -> None:
    """Delete the herd's runs, tasks and orphaned clocked rows, a statement each: the deployment
    is stopped, so no replica needs django-celery-beat's per-task delete signal (a locked read
    and a write of the change marker per task or clocked row, 11,000 statements for a herd of
    3,000)."""
    Run.objects.filter(periodic_task_id__in=tasks).delete()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_celery_beat_periodictask WHERE id = ANY(%s)", [tasks])
        cursor.execute(
            "DELETE FROM django_celery_beat_clockedschedule AS c WHERE NOT EXISTS"
            " (SELECT 1 FROM django_celery_beat_periodictask AS t WHERE t.clocked_id = c.id)"
        )


def _outcome(kind, size, runs, seen, executions, held) -> Outcome:
    late = [(dispatched - due).total_seconds() for _, due, dispatched in runs if dispatched]
    broker, arrived, copies = None, 0, 0
    if seen is not None:
        broker = []
        for task_id, due, _ in runs:
            times = seen.get(task_id)
            if times:
                arrived += 1
                copies += len(times) - 1
                broker.append(min(times) - due.timestamp())
    ids = {task_id for task_id, _, _ in runs}
    counted = Counter(e["task_id"] for e in executions if e["task_id"] in ids)
    return Outcome(kind, size, late, broker, len(late), arrived, copies, len(counted),
                   sum(1 for n in counted.values() if n > 1), held)


def _rows(o: Outcome) -> list[Row]:
    what = "clocked one-offs" if o.kind == "clocked" else "crontab tasks, one minute"
    label = f"herd, {o.size:,} {what}, 3 replicas, 2 guarded workers"
    if o.held:
        label += " held until every run was claimed"
    broker_ok = o.broker is None or (o.arrived == o.size and o.copies == 0)
    once = o.dispatched == o.size and o.executed == o.size and not o.executed_twice and broker_ok
    at_broker = ("n/a for this broker" if o.broker is None
                 else f"{o.arrived:,} arrived, {o.copies} extra copies")
    rows = [Row(label, "every run once: dispatched (ledger) / at the broker / executed (worker's log)",
                f"{o.dispatched:,} / {at_broker} / {o.executed:,} executed,"
                f" {o.executed_twice} twice", target=f"{o.size:,} each once", met=once)]
    targeted = o.size == TARGET_SIZE and not o.held
    for where, late in (("ledger", o.ledger), ("broker", o.broker)):
        if late is None:
            rows.append(Row(label, f"lateness median / p99 / max at the {where}",
                            "n/a for this broker"))
            continue
        worst = max(late, default=0.0)
        rows.append(Row(
            label, f"lateness median / p99 / max at the {where}",
            f"{percentile(late, 0.5):.3f} / {percentile(late, 0.99):.3f} / {worst:.3f} s",
            target=f"max <= {TARGET_MAX:.0f} s" if targeted else "",
            met=(bool(late) and worst <= TARGET_MAX) if targeted else None,
        ))
    return rows
