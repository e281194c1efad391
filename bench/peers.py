"""The peers of the correctness scenario: how each one is deployed, fed its tasks and watched.

``Peer`` is one system under test (ours, stock, RedBeat, the Redlock baseline, django-periodic-tasks
in its own virtualenv: ``bench.dpt_peer``): a deployment of
its own (queue, worker, execution log) and its beats; ``make_peer`` builds each as its
documentation runs it; ``database_tasks`` and ``redbeat_entries`` give it interval tasks;
``wait_for_worker`` waits until its worker has executed what was sent. ``bench.correctness``
runs the faults; ``tests/acceptance/test_bench_baselines.py`` runs each peer alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import Count
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

from bench import dpt_peer
from scheduling.models import Run
from tests.acceptance.deployment import Deployment

TASK = "project.tasks.record"
STOCK = "django_celery_beat.schedulers:DatabaseScheduler"
REDLOCK = "bench.redlock_beat:RedlockScheduler"
REDBEAT = "redbeat.RedBeatScheduler"
#: The mark each scheduler logs per message it sends, to find the busiest one.
SENT = {"redlock": "redlock: sent ", "stock": "Sending due task", "redbeat": "Sending due task",
        "dpt": dpt_peer.SENT}


@dataclass(frozen=True)
class Faults:
    """Sizes of the scenario (seconds unless said): pause and observe are multiples of every."""

    tasks: int
    every: int
    warm_slots: int  # whole intervals sent before the first window opens
    pause: int  # SIGSTOP to SIGCONT
    after_slots: int  # intervals counted after the SIGCONT
    observe: int  # seconds counted after the SIGKILL
    redbeat_tuned: int  # RedBeat's tuned lock timeout


FULL = Faults(tasks=20, every=5, warm_slots=2, pause=30, after_slots=4, observe=45,
              redbeat_tuned=30)
QUICK = Faults(tasks=10, every=3, warm_slots=1, pause=9, after_slots=2, observe=12,
               redbeat_tuned=5)
PEERS = ("ours", "stock", "redbeat", "redbeat_tuned", "redlock", "dpt")
#: Seconds from creating the database peers' tasks to their first slot: stock beat reloads its
#: schedule at its next tick (at most 5 s) and the reload itself takes seconds on a busy machine.
LEAD = 10.0


@dataclass
class Peer:
    """One system under test: its deployment, beat names and how it tells what it sent."""

    column: str  # one of PEERS
    kind: str  # ours, stock, redbeat, redlock, dpt
    prefix: str  # of its tasks' names
    deployment: Deployment
    beats: list[str]
    scheduler: str = ""
    env: dict[str, str] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)  # log sizes at the window's start

    def start(self, standbys: bool = False) -> None:
        """Start the beats; RedBeat's standby only with ``standbys``, once the first one holds
        the lock (so that the first one is the active beat)."""
        for name in self.beats:
            if self.kind == "redbeat" and (name != self.beats[0]) != standbys:
                continue
            if self.kind == "ours":
                self.deployment.start_beat(name)
            elif self.kind == "dpt":
                dpt_peer.start_scheduler(self.deployment, name)
            else:
                self.deployment.start_beat(name, scheduler=self.scheduler, **self.env)

    def start_worker(self) -> None:
        """Start the peer's worker: Celery's (concurrency 2), or django-tasks-db's db_worker."""
        if self.kind == "dpt":
            dpt_peer.start_worker(self.deployment)
        else:
            self.deployment.start_worker("worker", concurrency=2)

    def restart_exited(self) -> dict[str, int]:
        """Start again each beat that exited (a container's restart policy).

        Returns the size of each restarted beat's log before its restart.
        """
        dead = {name: self.deployment.log_path(name).stat().st_size for name in self.beats
                if not self.deployment.alive(name)}
        for name in dead:
            self.deployment.restart(name)
        return dead

    def mark(self) -> None:
        self.offsets = {n: self.deployment.log_path(n).stat().st_size for n in self.beats}

    def busiest(self, since: float) -> str:
        """The live beat that sent most since ``mark()`` (ours: claimed most since ``since``)."""
        live = [n for n in self.beats if self.deployment.alive(n)]
        if self.kind == "ours":
            claimed = dict(
                Run.objects.filter(
                    periodic_task_name__startswith=self.prefix,
                    dispatched_at__gte=datetime.fromtimestamp(since, UTC),
                ).values_list("claimed_by").annotate(n=Count("id")).values_list("claimed_by", "n")
            )
            return max(live, key=lambda n: claimed.get(n, 0))

        def sent(name: str) -> int:
            text = self.deployment.log_path(name).read_bytes()[self.offsets.get(name, 0):]
            return text.decode(errors="replace").count(SENT[self.kind])

        return max(live, key=sent)


def redis_url_for(broker_url: str) -> str | None:
    """The Redis for RedBeat and the Redlock baseline: BENCH_REDIS_URL, else a Redis broker's."""
    import os

    url = os.environ.get("BENCH_REDIS_URL")
    if url:
        return url
    return broker_url if broker_url.startswith(("redis://", "rediss://")) else None


def make_peer(bench, key: str, f: Faults, redis_url: str | None, run_id: str) -> Peer:
    deployment = bench.deployment(f"correctness-{key}")
    prefix = f"bench-{run_id}-{key}"
    containers = ["beat-1", "beat-2", "beat-3"]
    if key == "ours":
        return Peer(key, "ours", f"fault-ours-{run_id}", deployment,
                    ["replica-1", "replica-2", "replica-3"])
    if key == "stock":
        return Peer(key, "stock", f"fault-db-{run_id}", deployment, containers, STOCK)
    if key == "dpt":
        dpt_peer.migrate(deployment.env["DATABASE_URL"])
        return Peer(key, "dpt", prefix, deployment, containers)
    if key == "redlock":
        env = {"BENCH_REDLOCK_URL": redis_url, "BENCH_REDLOCK_TTL": str(f.every / 2),
               "BENCH_REDLOCK_PREFIX": prefix}
        return Peer(key, "redlock", f"fault-db-{run_id}", deployment, containers, REDLOCK, env)
    env = {"DJANGO_SETTINGS_MODULE": "bench.peer_settings", "BENCH_REDBEAT_URL": redis_url,
           "BENCH_REDBEAT_PREFIX": prefix}
    if key == "redbeat_tuned":
        env["BENCH_REDBEAT_LOCK_TIMEOUT"] = str(f.redbeat_tuned)
    return Peer(key, "redbeat", prefix, deployment, ["active", "standby"], REDBEAT, env)


def redbeat_entries(peer: Peer, f: Faults, redis_url: str | None) -> None:
    """Create the RedBeat deployment's entries in Redis, as RedBeat's docs do for dynamic tasks."""
    from celery import Celery
    from celery.schedules import schedule
    from redbeat import RedBeatSchedulerEntry

    app = Celery("bench-redbeat", set_as_current=False)
    app.conf.redbeat_redis_url = redis_url
    app.conf.redbeat_key_prefix = peer.env["BENCH_REDBEAT_PREFIX"]
    for i in range(f.tasks):
        name = f"{peer.prefix}-{i}"
        RedBeatSchedulerEntry(name, TASK, schedule(timedelta(seconds=f.every)),
                              kwargs={"label": name}, app=app).save()


def database_tasks(prefix: str, f: Faults, anchor: float, stock: bool) -> None:
    """Interval tasks ``<prefix>-<i>`` with their first slot at ``anchor`` (epoch seconds).

    Stock beat keeps no slots: its next send is its last send plus the interval, and a task
    without ``last_run_at`` is due when a beat loads it. ``last_run_at`` one interval before the
    anchor puts every stock beat's sends on the same instants; ours anchors the slots at
    ``start_time`` and is given no ``last_run_at`` (it would honour stock's).
    """
    every = timedelta(seconds=f.every)
    row, _ = IntervalSchedule.objects.get_or_create(every=f.every, period=IntervalSchedule.SECONDS)
    first = datetime.fromtimestamp(anchor, UTC)
    PeriodicTask.objects.bulk_create([
        PeriodicTask(name=f"{prefix}-{i}", task=TASK, interval=row, start_time=first,
                     kwargs=json.dumps({"label": f"{prefix}-{i}"}),
                     last_run_at=first - every if stock else None)
        for i in range(f.tasks)
    ])
    PeriodicTasks.update_changed()  # bulk_create sends no signal: tell stock beat to reload


def tell_stock_beats(until: float) -> None:
    """Mark the schedule changed once a second until ``until`` (epoch seconds, a second before the
    tasks' first slot), so that every stock beat started before the tasks were created loads them.

    Why once is not enough: django-celery-beat's ``schedule_changed`` keeps the last change time
    it saw, and compares the next one with it only when it has one: the first check after the
    initial read records the time and reports no change. Tasks created between a beat's initial
    read and its next tick (up to its 5 s ``max_interval``) are so missed until the schedule
    changes again (seen once in CI: a Redlock baseline beat sent none of its 75 runs). Each check
    here sees a change newer than the one before, at most a second after it.
    """
    while time.time() < until:
        PeriodicTasks.update_changed()
        time.sleep(min(1.0, max(0.0, until - time.time())))


def wait_for_worker(deployment: Deployment, waiting=lambda: 0, timeout: float = 60.0) -> None:
    """Wait until ``waiting()`` (messages left at the broker) is 0 and the deployment's execution
    log has not grown for 1.5 s; give up after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last, steady = -1, time.monotonic()
    while time.monotonic() < deadline:
        size = deployment.execution_log.stat().st_size
        if size != last or waiting():
            last, steady = size, time.monotonic()
        elif time.monotonic() - steady >= 1.5:
            return
        time.sleep(0.1)
