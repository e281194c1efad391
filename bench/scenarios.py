"""The issue's scenarios, each returning rows of the table.

Every scenario runs our scheduler (``LedgerScheduler``; real ``celery beat`` processes wherever
replicas matter), stock django-celery-beat ``DatabaseScheduler`` and raw kombu publishing where
they apply, on the same PostgreSQL and broker. Times come from the database clock
(``clock_timestamp()``) and, for the broker cross-check, from when messages reached the broker.
"""

from __future__ import annotations

import random
import subprocess
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from bench import data
from bench.env import Arrivals, Broker, cpu_seconds, postgres_cpu_seconds, rss_mb
from bench.profile import profiled
from bench.report import Row, median, ms, percentile, seconds
from scheduling import ledger
from scheduling.ledger import claim_rows
from scheduling.ledger.claim import claim_due
from scheduling.models import Run
from scheduling.run_message import build_message
from tests.acceptance.deployment import Deployment

STOCK = "django_celery_beat.schedulers:DatabaseScheduler"
READY = "beat: Starting..."


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; the full run uses the issue's sizes."""

    burst: int
    idle: tuple[int, int, int]
    ticks: int
    lateness_tasks: int
    window: float
    storm_tasks: int
    failover_trials: int
    history: int
    stock_cap: float
    settle: float
    guard_runs: int


FULL = Sizes(10_000, (1_000, 10_000, 100_000), 300, 1_000, 60.0, 10_000, 20, 10_000_000,
             180.0, 20.0, 5_000)
QUICK = Sizes(200, (100, 1_000, 3_000), 60, 50, 4.0, 300, 2, 50_000, 4.0, 2.0, 200)

#: The environment of a deployment that runs no worker: its runs are dispatched and never started,
#: and at the default delivery deadline (300 s) its reconcile passes would re-publish them in the
#: longer scenarios, work that a deployment with workers does not do. Re-publishing has tests of
#: its own (tests/acceptance/test_delivery.py); here it is moved a day away.
NO_WORKER = {"SCHEDULING_DELIVERY_TIMEOUT": "86400"}

#: Ticks between two reconcile passes at the defaults (60 s reconcile interval, 1 s ticks).
TICKS_PER_RECONCILE = 60


class Bench:
    """Shared state of one benchmark run: sizes, work folder, broker, and the task pool."""

    def __init__(self, sizes: Sizes, workdir: Path, log=print, profile: Path | None = None) -> None:
        self.sizes, self.workdir, self.log = sizes, workdir, log
        #: Where ``bench.profile.profiled`` writes the replicas' profiles (``--profile``), or None.
        self.profile = profile
        self.broker = Broker()
        self.pool: list[int] = []  # interval tasks, one day apart, planned
        #: Idle tick cost by number of tasks, as ``idle`` measured it (``bench.scale`` compares).
        self.tick_costs: dict[int, TickCost] = {}
        #: Claim and poll seconds by number of historical runs, as ``ledger_queries`` timed them.
        self.query_times: dict[int, dict[str, float]] = {}
        #: Raw kombu's CPU seconds per published message, as ``burst`` measured it, or None.
        self.publish_cpu: float | None = None

    def grow_pool(self, size: int) -> None:
        """Have ``size`` planned interval tasks (every day) in the pool."""
        if size > len(self.pool):
            self.pool += data.interval_tasks("pool", len(self.pool), size, timedelta(days=1))
            data.plan()

    def deployment(self, label: str, **env: str) -> Deployment:
        folder = self.workdir / label
        folder.mkdir(parents=True, exist_ok=True)
        return Deployment(folder, **env)


def _start_stock(deployment: Deployment, name: str) -> None:
    deployment._start(name, ["beat", "-l", "info", "--pidfile=", "-S", STOCK], {})


def _ready(deployment: Deployment, *names: str) -> None:
    for name in names:
        deployment.wait_for_log(name, READY, timeout=120)


def close(bench: Bench, deployment: Deployment) -> None:
    """Stop `deployment`'s processes and delete its queue from the bench's broker."""
    deployment.stop()
    bench.broker.delete(deployment.queue)


# 1. Burst ---------------------------------------------------------------------------------------


#: A burst's time with 3 replicas against raw kombu publishing the same messages (issue 17).
BURST_TARGET = 1.1


def burst(bench: Bench) -> list[Row]:
    """10,000 tasks due at one instant: 1, 2, 4 and 3 replicas, raw publish, one stock beat."""
    n = bench.sizes.burst
    bench.grow_pool(n)
    tasks = bench.pool[:n]
    costs = {r: _burst_ours(bench, tasks, r) for r in (1, 2, 4, 3)}
    ours = {r: cost.seconds for r, cost in costs.items()}
    raw, celery, raw_cpu, celery_cpu = _burst_raw(bench, tasks)
    bench.publish_cpu = raw_cpu / n
    stock, stock_sent, stock_cpu = _burst_stock(bench, tasks)
    label = f"burst {n:,} tasks"
    rows = [
        Row(label, f"all dispatched, {r} replica{'s' * (r > 1)}", _rate(ours[r], n))
        for r in (1, 2, 4)
    ]
    rows[-1].ratio = f"{ours[1] / ours[4]:.2f}x"
    rows[-1].target = "throughput 4 replicas >= 1 replica"
    rows[-1].met = ours[4] <= ours[1]
    rows.append(Row(label, "3 replicas vs raw kombu publish", _rate(ours[3], n),
                    raw=f"kombu {_rate(raw, n)}; Celery send_task, no ledger {_rate(celery, n)}",
                    ratio=f"{ours[3] / raw:.2f}x", target=f"<= {BURST_TARGET}x raw",
                    met=ours[3] <= BURST_TARGET * raw))
    if stock_sent >= n:
        stock_text, floor = _rate(stock, n), ""
    else:
        stock_text = f">= {stock:.1f} s ({stock_sent:,}/{n:,} sent; cap)"
        floor = ">= "
    rows.append(Row(label, "3 replicas vs 1 stock DatabaseScheduler", _rate(ours[3], n),
                    stock=stock_text, ratio=f"{floor}{stock / ours[3]:.1f}x faster",
                    target=">= 5x faster", met=stock / ours[3] >= 5))
    cost = costs[3]
    database = "" if cost.postgres is None else f" + PostgreSQL {per_thousand(cost.postgres, n)}"
    rows.append(Row(label, "CPU per 1,000 runs: 3 replicas (+ PostgreSQL) vs raw kombu",
                    f"{per_thousand(cost.replicas, n)}{database}",
                    stock=f"{per_thousand(stock_cpu, stock_sent)} (its beat)" if stock_sent else "",
                    raw=f"kombu {per_thousand(raw_cpu, n)}; Celery send_task, no ledger"
                    f" {per_thousand(celery_cpu, n)}",
                    ratio=f"{cost.replicas / raw_cpu:.1f}x", target="replicas <= 2x raw",
                    met=cost.replicas <= 2 * raw_cpu))
    return rows


@dataclass(frozen=True)
class BurstCost:
    """One burst of ours: seconds from the instant to the last dispatch, and the CPU seconds the
    replicas and the PostgreSQL server (None when not on this host) used from the runs' move to
    that instant to the end."""

    seconds: float
    replicas: float
    postgres: float | None


def per_thousand(cpu: float, runs: int) -> str:
    return f"{cpu * 1000 / runs:.2f} CPU s"


def _rate(elapsed: float, n: int) -> str:
    return f"{elapsed:.2f} s ({n / elapsed:,.0f}/s)"


def _burst_ours(bench: Bench, tasks: list[int], replicas: int) -> BurstCost:
    names = [f"replica-{i}" for i in range(1, replicas + 1)]
    deployment = bench.deployment(f"burst-{replicas}")
    try:
        for name in names:
            deployment.start_beat(name)
        _ready(deployment, *names)
        time.sleep(1.0)  # each replica's first tick (its startup reconcile) is over
        pids = [deployment.processes[name].pid for name in names]
        at, moved = data.make_due(tasks)
        cpu, database = sum(map(cpu_seconds, pids)), postgres_cpu_seconds()
        with profiled(bench.profile, f"burst-{replicas}", pids):
            data.wait_claimed(at, timeout=600)
        finished = ledger.database_now()
        cpu = sum(map(cpu_seconds, pids)) - cpu
        after = postgres_cpu_seconds()
        database = None if database is None or after is None else after - database
        done = Run.objects.filter(scheduled_for=at, status=Run.Status.DISPATCHED).count()
        if done < moved:
            raise RuntimeError(f"burst with {replicas} replicas: {done}/{moved} dispatched")
        arrived = bench.broker.count(deployment.queue)
        if arrived != moved:
            raise RuntimeError(f"burst: {moved} runs dispatched, {arrived} messages at the broker")
    finally:
        close(bench, deployment)
    data.forget_runs(tasks)
    elapsed = (finished - at).total_seconds()
    server = "not on this host" if database is None else f"{database:.2f} s"
    bench.log(f"  burst, {replicas} replicas: {elapsed:.2f} s, CPU {cpu:.2f} s, PostgreSQL CPU {server}")
    return BurstCost(elapsed, cpu, database)


def _burst_raw(bench: Bench, tasks: list[int]) -> tuple[float, float, float, float]:
    """Publish the same messages without the ledger: one connection, a loop, in this process.

    Returns (seconds with kombu alone: prebuilt messages, ``Producer.publish`` to the default
    exchange with the queue as routing key, which is where Celery sends a task routed to a direct
    queue; seconds with Celery's ``send_task``, which builds, routes and signals each message as
    every scheduler does, stock beat included, before kombu publishes it; CPU seconds of this
    process in each loop: kombu's, send_task's).
    """
    from kombu import Connection, Queue

    from project.celery import app

    runs = Run.objects.pending().scheduled().filter(periodic_task_id__in=tasks)
    messages = [build_message(run, run.periodic_task) for run in runs.select_related("periodic_task")]
    timings, cpus = [], []
    for celery in (False, True):
        name = f"raw-{uuid.uuid4().hex[:10]}"
        with Connection(bench.broker.url) as conn:
            Queue(name, routing_key=name)(conn.default_channel).declare()  # before the clock
            producer = conn.Producer(serializer="json")
            prepared = [
                app.amqp.as_task_v2(m.options["task_id"], m.task, m.args, m.kwargs)
                for m in messages
            ]
            started, used = time.perf_counter(), time.process_time()
            for message, task in zip(messages, prepared, strict=True):
                if celery:
                    app.send_task(
                        message.task, args=message.args, kwargs=message.kwargs,
                        producer=producer, **{**message.options, "queue": name},
                    )
                else:
                    producer.publish(
                        task.body, exchange="", routing_key=name,
                        headers={**task.headers, **message.options["headers"]},
                        **task.properties,
                    )
            timings.append(time.perf_counter() - started)
            cpus.append(time.process_time() - used)
        arrived = bench.broker.count(name)
        bench.broker.delete(name)
        if arrived != len(messages):
            raise RuntimeError(f"raw publish: {len(messages)} sent, {arrived} at the broker")
    bench.log(f"  raw publish: kombu {timings[0]:.2f} s (CPU {cpus[0]:.2f} s),"
              f" Celery send_task {timings[1]:.2f} s (CPU {cpus[1]:.2f} s)")
    return timings[0], timings[1], cpus[0], cpus[1]


def _burst_stock(bench: Bench, tasks: list[int]) -> tuple[float, int, float]:
    """One stock beat with the same tasks due at one instant; capped at ``stock_cap`` seconds.

    Returns (seconds from the instant, or from stock's start when it was ready later, until the
    last message reached the broker or the cap; messages sent by then; the beat's CPU seconds
    meanwhile).
    """
    n = len(tasks)
    at = ledger.database_now() + timedelta(seconds=5 + n / 1000)
    PeriodicTask.objects.filter(pk__in=tasks).update(last_run_at=at - timedelta(days=1))
    deployment = bench.deployment("burst-stock")
    try:
        _start_stock(deployment, "stock")
        _ready(deployment, "stock")
        start = max(at, ledger.database_now())
        time.sleep(max(0.0, (start - ledger.database_now()).total_seconds()))
        pid = deployment.processes["stock"].pid
        cpu = cpu_seconds(pid)
        reached = bench.broker.wait_count(deployment.queue, n, bench.sizes.stock_cap)
        end = ledger.database_now()
        cpu = cpu_seconds(pid) - cpu
        sent = bench.broker.count(deployment.queue)
    finally:
        close(bench, deployment)
    data.ScheduleChange.objects.all().delete()  # stock's write-back of last_run_at
    elapsed = (end - start).total_seconds()
    bench.log(f"  stock burst: {sent}/{n} in {elapsed:.1f} s ({'done' if reached else 'cap'}),"
              f" CPU {cpu:.2f} s")
    return elapsed, sent, cpu


# 2. Idle tick -----------------------------------------------------------------------------------


class _Meter:
    """Counts the queries and client-side database time of the statements Django runs, and keeps
    each statement's seconds and the start of its text (``statements``)."""

    def __init__(self) -> None:
        self.queries, self.seconds = 0, 0.0
        self.statements: list[tuple[float, str]] = []

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            self.queries += 1
            self.seconds += took
            self.statements.append((took, " ".join(sql.split())[:90]))


def _ticks(scheduler, count: int, before=None) -> tuple[float, float, float, tuple]:
    """Median queries, database seconds and wall seconds of ``count`` ticks, and the three
    slowest statements (seconds, text) of the tick of median database time."""
    meters, wall = [], []
    for _ in range(count):
        if before is not None:
            before()
        meter = _Meter()
        with connection.execute_wrapper(meter):
            started = time.perf_counter()
            scheduler.tick()
            wall.append(time.perf_counter() - started)
        meters.append(meter)
    middle = sorted(meters, key=lambda m: m.seconds)[len(meters) // 2]
    slowest = tuple(sorted(middle.statements, reverse=True)[:3])
    return (median([m.queries for m in meters]), median([m.seconds for m in meters]),
            median(wall), slowest)


@dataclass(frozen=True)
class TickCost:
    """Idle ticks of one scheduler: the medians (queries, database seconds, wall seconds) of a
    poll-only tick and of a tick with a reconcile pass, and both amortized over
    ``TICKS_PER_RECONCILE`` ticks (one pass among them, as at the defaults)."""

    poll: tuple[float, float, float, tuple]
    passes: tuple[float, float, float, tuple]

    @property
    def queries(self) -> float:
        every = TICKS_PER_RECONCILE
        return ((every - 1) * self.poll[0] + self.passes[0]) / every

    @property
    def db(self) -> float:
        every = TICKS_PER_RECONCILE
        return ((every - 1) * self.poll[1] + self.passes[1]) / every

    def describe(self) -> str:
        return (f"{self.queries:.2f} q, {ms(self.db)} (poll {self.poll[0]:.0f} q"
                f" {ms(self.poll[1])}; reconcile {self.passes[0]:.0f} q {ms(self.passes[1])})")

    def slowest(self) -> str:
        """The slowest statements of the median reconcile pass, for the log."""
        return "; ".join(f"{ms(seconds)} {text}" for seconds, text in self.passes[3])


#: Reconcile passes a measured scheduler makes before its idle ticks are measured.
SETTLING_PASSES = 3


def tick_cost(bench: Bench) -> TickCost:
    """Measure idle ticks of a ``LedgerScheduler`` in this process over the tasks there are now.

    Its start-up reconcile and ``SETTLING_PASSES`` passes first (not counted), then ``ticks``
    poll-only ticks and a twentieth as many (at least 3) with a reconcile pass forced. Closes
    this process's database connection.
    """
    from project.celery import app
    from scheduling.schedulers import LedgerScheduler

    scheduler = LedgerScheduler(app=app)
    scheduler.tick()  # the startup reconcile

    def force() -> None:
        scheduler._last_reconcile = float("-inf")

    # Idle: what earlier scenarios changed in the last 10 minutes (the change log's retention)
    # is looked at until it settles, two passes when no transaction stays open; the replica
    # then passes over nothing, which is what is measured.
    for _ in range(SETTLING_PASSES):
        force()
        scheduler.tick()
    poll = _ticks(scheduler, bench.sizes.ticks)
    passes = _ticks(scheduler, max(3, bench.sizes.ticks // 20), before=force)
    # The scheduler bounded this process's session (a 5 s statement timeout): the bulk loads
    # that follow get a session of their own.
    connection.close()
    return TickCost(poll, passes)


def idle(bench: Bench) -> list[Row]:
    """Queries and database time per tick with nothing due, at three sizes; stock beside it."""
    from django_celery_beat.schedulers import DatabaseScheduler

    from project.celery import app

    rows = []
    for size in bench.sizes.idle:
        bench.grow_pool(size)
        # The bulk load just written (tasks, runs, VACUUM ANALYZE) is still being flushed to
        # disk: measure the steady state an idle replica sees, not that aftermath.
        time.sleep(bench.sizes.settle / 2)
        cost = bench.tick_costs[size] = tick_cost(bench)
        bench.log(f"  idle tick at {size:,} tasks: {cost.describe()}; the slowest statements of"
                  f" a pass: {cost.slowest()}")
        stock = DatabaseScheduler(app=app)
        stock.tick()  # the initial read of every task
        stock_tick = _ticks(stock, max(3, bench.sizes.ticks // 10))  # each one is slow
        rows.append(Row(
            f"idle tick, {size:,} tasks",
            "queries / DB time per tick (1 reconcile pass per 60 ticks)",
            cost.describe(),
            stock=f"{stock_tick[0]:.2f} q, {ms(stock_tick[1])} (tick {ms(stock_tick[2])} CPU)",
            target="<= 2 queries per tick", met=cost.queries <= 2,
        ))
        bench.log(f"  idle {size}: {rows[-1].ours} | stock {rows[-1].stock}")
        del stock
    low, high = bench.sizes.idle[0], bench.sizes.idle[-1]
    rows.append(tick_ratio_row(bench.tick_costs[high], bench.tick_costs[low], high, low))
    return rows


def tick_ratio_row(high: TickCost, low: TickCost, high_size: int, low_size: int) -> Row:
    """The row comparing the amortized database time per tick at two numbers of tasks."""
    ratio = high.db / low.db
    return Row(f"idle tick, {high_size:,} vs {low_size:,} tasks", "DB time per tick ratio",
               f"{ms(high.db)} / {ms(low.db)}", ratio=f"{ratio:.2f}x", target="<= 1.5x",
               met=ratio <= 1.5)


# 5. Memory --------------------------------------------------------------------------------------


def memory(bench: Bench) -> list[Row]:
    """Resident memory of one replica and of one stock beat, with the whole pool enabled."""
    size = bench.sizes.idle[-1]
    bench.grow_pool(size)
    deployment = bench.deployment("memory")
    try:
        deployment.start_beat("replica")
        _start_stock(deployment, "stock")
        _ready(deployment, "replica", "stock")
        peaks = {name: settled_rss(deployment, name, bench.sizes.settle) for name in
                 ("replica", "stock")}
    finally:
        close(bench, deployment)
    ours, stock = peaks["replica"], peaks["stock"]
    bench.log(f"  memory: ours {ours}, stock {stock}")
    return [Row(f"memory, {size:,} tasks", "RSS of one replica (peak)",
                f"{ours[0]:.0f} MB (peak {ours[1]:.0f} MB)",
                stock=f"{stock[0]:.0f} MB (peak {stock[1]:.0f} MB)",
                ratio=f"stock {stock[1] / ours[1]:.1f}x", target="<= 150 MB",
                met=ours[1] <= 150)]


def settled_rss(deployment: Deployment, name: str, settle: float) -> tuple[float, float]:
    """RSS and peak RSS (MiB) once the process's RSS has not grown for ``settle`` seconds."""
    pid = deployment.processes[name].pid
    last, steady_since = 0.0, time.monotonic()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rss, peak = rss_mb(pid)
        if rss > last * 1.01:
            last, steady_since = rss, time.monotonic()
        elif time.monotonic() - steady_since >= settle:
            return rss, peak
        time.sleep(0.5)
    return rss_mb(pid)


# 3 and 6. Lateness and edit storm ---------------------------------------------------------------


def lateness_and_storm(bench: Bench) -> list[Row]:
    """Tasks due every second spread over the second, 3 replicas; then one crontab edit a second;
    then both windows again with one CPU-bound process (``yes``) beside the replicas, as on a
    host the scheduler shares with the app it schedules.

    Window A: 1,000 interval tasks (every 1 s) for 60 s. Window B: the same, while one of the
    10,000 crontab tasks is edited (``save()``, as the admin does) every second. Lateness comes
    from the ledger and is cross-checked with when the messages reached the broker.
    """
    crontab_ids = data.crontab_tasks("crontab", bench.sizes.storm_tasks)
    data.plan()
    rows = _lateness_windows(bench, crontab_ids, hog=False)
    rows += _lateness_windows(bench, crontab_ids, hog=True)
    PeriodicTask.objects.filter(pk__in=crontab_ids).update(enabled=False)
    return rows


def _lateness_windows(bench: Bench, crontab_ids: list[int], hog: bool) -> list[Row]:
    s = bench.sizes
    beside = ", one CPU hog beside" if hog else ""
    names = ["replica-1", "replica-2", "replica-3"]
    deployment = bench.deployment("lateness-hog" if hog else "lateness", **NO_WORKER)
    arrivals = Arrivals(bench.broker, deployment.queue).start()
    hogging = None
    try:
        for name in names:
            deployment.start_beat(name)
        _ready(deployment, *names)
        if hog:
            hogging = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
        # Created while the replicas run (they plan them from the change log), first slots a
        # few seconds ahead, spread over the second.
        base = ledger.database_now() + timedelta(seconds=3)
        interval_ids = data.interval_tasks(
            "every-second-hog" if hog else "every-second", 0, s.lateness_tasks,
            timedelta(seconds=1), start_time=lambda i: base + timedelta(seconds=i / s.lateness_tasks),
        )
        a0 = base + timedelta(seconds=2)
        a1 = a0 + timedelta(seconds=s.window)
        sleep_until(a1)
        full_before = _full_reconciles(deployment, names)
        rng = random.Random(6)
        edits = 0
        b1 = a1 + timedelta(seconds=s.window)
        while ledger.database_now() < b1:
            data.edit_one(crontab_ids, rng)
            edits += 1
            sleep_until(a1 + timedelta(seconds=edits))
        full_during = _full_reconciles(deployment, names) - full_before
        time.sleep(2.0)
    finally:
        if hogging is not None:
            hogging.kill()
            hogging.wait()
        deployment.stop()
        seen = arrivals.stop()
        bench.broker.delete(deployment.queue)
    PeriodicTask.objects.filter(pk__in=interval_ids).update(enabled=False)
    label = f"lateness, {s.lateness_tasks:,} tasks/s, 3 replicas, {s.window:.0f} s{beside}"
    window_a, window_b = lateness(a0, a1), lateness(a1, b1)
    rows = lateness_rows(label, window_a, seen, p99=0.250 if hog else 0.100)
    storm_label = f"edit storm, {s.storm_tasks:,} crontab tasks, {edits} edits{beside}"
    storm = lateness_rows(storm_label, window_b, seen, p99=0.250 if hog else 0.200)[:1]
    if hog:  # the storm's own cost, apart from the hog's: within 2x the same run's window A
        quiet, stormy = percentile(window_a[1], 0.99), percentile(window_b[1], 0.99)
        storm[0].ratio = f"{stormy / quiet:.2f}x window A" if quiet else ""
        storm[0].target = "<= 250 ms and <= 2x window A"
        storm[0].met = bool(storm[0].met) and bool(quiet) and stormy <= 2 * quiet
    storm.append(Row(storm_label, "full reloads (full reconcile passes) during the storm",
                     str(full_during), target="0", met=full_during == 0))
    return rows + storm


def sleep_until(at: datetime) -> None:
    time.sleep(max(0.0, (at - ledger.database_now()).total_seconds()))


def _full_reconciles(deployment: Deployment, names: list[str]) -> int:
    return sum(
        deployment.log_path(n).read_text(errors="replace").count("full reconcile") for n in names
    )


def lateness(since: datetime, until: datetime) -> tuple[list[tuple], list[float]]:
    """The scheduled runs with a slot in [since, until), not cancelled, as (task id, slot,
    dispatched at, status); and the lateness of each in seconds (an undispatched run counts as
    late as ``until``)."""
    runs = list(
        Run.objects.scheduled().filter(scheduled_for__gte=since, scheduled_for__lt=until)
        .exclude(status=Run.Status.CANCELLED)
        .values_list("task_id", "scheduled_for", "dispatched_at", "status")
    )
    return runs, [((dispatched or until) - slot).total_seconds() for _, slot, dispatched, _ in runs]


def lateness_rows(
    label: str, window: tuple[list[tuple], list[float]], arrivals: dict[str, list[float]] | None,
    p99: float, max_late: float = 1.0,
) -> list[Row]:
    """The rows of one window (``lateness``'s runs and their lateness): the p99 against ``p99``
    seconds, the max against ``max_late`` seconds (when ``p99`` is under 200 ms), the broker's."""
    runs, late = window
    worst = max(late, default=0.0)
    rows = [
        Row(label, f"lateness p99 (ledger, {len(runs):,} runs)", ms(percentile(late, 0.99)),
            target=f"<= {p99 * 1000:.0f} ms", met=bool(runs) and percentile(late, 0.99) <= p99),
    ]
    if p99 < 0.2:
        rows.append(Row(label, "lateness max (ledger)", ms(worst),
                        target=f"<= {max_late * 1000:.0f} ms",
                        met=bool(runs) and worst <= max_late))
    if arrivals is None:
        rows.append(Row(label, "lateness p99 / max at the broker", "n/a for this broker"))
        return rows
    broker, missing, copies = [], 0, 0
    for task_id, slot, _, _ in runs:
        times = arrivals.get(task_id)
        if not times:
            missing += 1
            continue
        copies += len(times) - 1
        broker.append(min(times) - slot.timestamp())
    rows.append(Row(
        label, "lateness p99 / max at the broker (cross-check)",
        f"{ms(percentile(broker, 0.99))} / {ms(max(broker, default=0.0))}"
        f"; {missing} missing, {copies} extra copies",
        target="every run arrives once", met=missing == 0 and copies == 0,
    ))
    return rows


# 4. Failover ------------------------------------------------------------------------------------


#: Seconds ahead of now each failover trial's slot is moved: above a replica's longest sleep.
FAILOVER_LEAD = 2.0
#: Longest takeover of a claim whose replica was killed (issue 17), seconds.
FAILOVER_TARGET = 0.5


def failover(bench: Bench) -> list[Row]:
    """SIGKILL the replica that holds a claim (published, not committed); time the takeover.

    Each trial's run is the task's next slot, moved to ``FAILOVER_LEAD`` seconds ahead: every
    replica has polled since (``cadences.MAX_INTERVAL``, 0.5 s) and wakes at the slot, as for any
    scheduled run. (A run-now request is found at the replicas' next tick instead, up to
    ``cadences.MAX_INTERVAL`` later: that is its lateness, not a failover.) Every replica pauses 1.5 s
    between publishing and committing (the tests' pausing replica, ``tests.acceptance.pausing``),
    so the one holding the claim is known from its log; the figure is from the kill to the moment
    another replica published the run again.
    """
    trials = bench.sizes.failover_trials
    task = PeriodicTask.objects.get(
        pk=data.interval_tasks("failover", 0, 1, timedelta(days=1))[0]
    )
    data.plan()
    deployment = bench.deployment("failover")
    live = [f"replica-{i}" for i in range(1, 4)]
    times: list[float] = []
    try:
        for name in live:
            deployment.start_beat(name, pause_after_publish=1.5)
        _ready(deployment, *live)
        for trial in range(trials):
            at, _ = data.make_due([task.pk], lead=FAILOVER_LEAD)
            run = Run.objects.pending().get(periodic_task=task, scheduled_for=at)
            victim = _claim_holder(deployment, live, run.task_id)
            killed_at = ledger.database_now()
            deployment.kill(victim)
            live.remove(victim)
            committed = Run.objects.filter(pk=run.pk, status=Run.Status.DISPATCHED)
            deadline = time.monotonic() + 30
            while not committed.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            done = committed.values_list("dispatched_at", "claimed_by").first()
            if done is None or done[1] == victim:
                raise RuntimeError(f"failover trial {trial}: not taken over ({done})")
            times.append((done[0] - killed_at).total_seconds())
            replacement = f"replica-{4 + trial}"
            deployment.start_beat(replacement, pause_after_publish=1.5)
            live.append(replacement)
            _ready(deployment, replacement)
    finally:
        close(bench, deployment)
    bench.log(f"  failover: {[round(t, 3) for t in times]}")
    label = f"failover, {trials} trials"
    return [
        Row(label, "kill to re-dispatch by another replica, median", seconds(median(times))),
        Row(label, "kill to re-dispatch by another replica, max", seconds(max(times)),
            stock="no takeover (one beat)", target=f"<= {FAILOVER_TARGET} s",
            met=max(times) <= FAILOVER_TARGET),
    ]


def _claim_holder(deployment: Deployment, names: list[str], task_id: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for name in names:
            if f"published {task_id}" in deployment.log_path(name).read_text(errors="replace"):
                return name
        time.sleep(0.01)
    raise RuntimeError(f"no replica published {task_id} within 30 s")


# Ledger size: 10 million historical runs ----------------------------------------------------------


def history(bench: Bench) -> tuple[list[Row], dict[str, str]]:
    """Claim and poll queries with ``history`` finished runs in the ledger; their plans.

    Returns the rows and the EXPLAIN (ANALYZE, BUFFERS) text of each query.
    """
    total = bench.sizes.history
    bench.grow_pool(bench.sizes.burst)
    tasks = bench.pool[: bench.sizes.burst]
    took = data.historical_runs(total, tasks)
    bench.log(f"  {total:,} historical runs inserted in {took:.0f} s")
    due = ledger.database_now() - timedelta(seconds=1)
    data.move_pending(tasks[:100], due)
    return ledger_queries(bench, total)


def ledger_queries(bench: Bench, total: int) -> tuple[list[Row], dict[str, str]]:
    """Time the claim (100 runs due) and poll queries over the ledger as it is, ``total``
    historical runs in it; their rows and EXPLAIN (ANALYZE, BUFFERS) plans.

    The medians are kept in ``bench.query_times[total]``.
    """
    queries = {
        "claim": captured(lambda: claim_due(100, "default")),
        "poll": captured(ledger.poll),
    }
    intended = {"claim": "scheduling_run_pending_due", "poll": "scheduling_run_pending_due"}
    rows, plans = [], {}
    times = bench.query_times.setdefault(total, {})
    for name, (sql, params) in queries.items():
        plans[name] = _explain(sql, params)
        timings = [timed(sql, params, prepared=name == "claim") for _ in range(20)]
        times[name] = median(timings)
        uses = intended[name] in plans[name]
        rows.append(Row(
            f"ledger with {total:,} finished runs",
            f"{name} query{', prepared as the scheduler sends it,' * (name == 'claim')}"
            " (median of 20)",
            ms(median(timings)), target=f"uses {intended[name]}", met=uses,
        ))
    return rows, plans


def captured(call) -> tuple[str, list | dict]:
    """The first SQL statement ``call`` runs, with its parameters (a list, or a dict for named
    placeholders such as the claim's); rolled back."""
    seen: list[tuple[str, list | dict]] = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, dict(params) if isinstance(params, dict) else list(params or [])))
        return execute(sql, params, many, context)

    try:
        with transaction.atomic(), connection.execute_wrapper(wrapper):
            call()
            raise _Rollback
    except _Rollback:
        pass
    return next((sql, p) for sql, p in seen if "SAVEPOINT" not in sql.upper())


class _Rollback(Exception):
    pass


def _explain(sql: str, params: list | dict) -> str:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            text = "\n".join(row[0] for row in cursor.fetchall())
            raise _Rollback(text)
    except _Rollback as done:
        return str(done)


def timed(sql: str, params: list | dict, prepared: bool) -> float:
    """Seconds to execute ``sql`` and fetch its rows, in a transaction that commits (the claim
    writes nothing, and a rollback would drop psycopg's prepared statements); ``prepared``:
    as the scheduler sends the claim (``scheduling.ledger.claim_rows.prepared``), planned once."""
    with (
        transaction.atomic(),
        claim_rows.prepared("default") if prepared else nullcontext(),
        connection.cursor() as cursor,
    ):
        started = time.perf_counter()
        cursor.execute(sql, params)
        cursor.fetchall()
        return time.perf_counter() - started
