"""The costs that grow with size and time (issue 17): a million periodic tasks, a day's ledger.

- ``million``: 1,000,000 interval tasks created in bulk and planned; the idle tick against the
  1,000-task figure, one real replica's start-up pass and resident memory, and how soon an edit
  is re-planned in the ledger while it runs.
- ``day_ledger``: 1,000 runs/s with the built-in prune on, then off (the ledger's size over the
  window, lateness against the window without prune); it runs before the historical runs exist,
  which its prune would delete.
- ``history_growth``: the history scenario's ledger (``scenarios.history``) grown to 50 M
  historical runs, the claim and poll timed again against the 10 M figures.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from bench import data, scenarios
from bench.env import Arrivals, rss_mb
from bench.report import Row, median, ms, percentile
from bench.scenarios import READY, Bench, close, settled_rss, sleep_until, tick_ratio_row
from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import Deployment

#: The line a replica logs when a full reconcile pass is over, with what it planned and its time.
FULL_PASS = re.compile(r"full reconcile: planned (\d+) runs in ([\d.]+) s")
PRUNED = re.compile(r"built-in prune deleted (\d+) runs")
#: Seconds a replica's start-up pass is waited for (then the row says it did not finish).
STARTUP_CAP = 600.0


@dataclass(frozen=True)
class ScaleSizes:
    """How big the scale scenarios are; the full run uses the issue's sizes."""

    tasks: int  # million: periodic tasks
    baseline: int  # the idle tick figure the million's is compared with
    edits: int  # edits timed while the replica runs
    rate: int  # day's ledger: interval tasks every second (runs/s)
    replicas: int
    window: float  # seconds of each window, prune on and off
    retention: float  # SCHEDULING_PRUNE_OLDER_THAN, seconds
    prune_interval: float  # scheduling.cadences.PRUNE_INTERVAL, seconds
    grown: int  # historical runs the history's ledger grows to
    block: int  # historical runs inserted per step of the growth (its rate logged per step)
    load_budget: float  # seconds the growth may take: it stops before a step that would pass it
    #: Seconds between the autovacuum rounds of the day's ledger (``_Autovacuum``); None: the
    #: server's ``autovacuum_naptime``.
    naptime: float | None = None


FULL = ScaleSizes(1_000_000, 1_000, 10, 1_000, 3, 180.0, 60.0, 10.0, 50_000_000, 2_500_000,
                  2400.0)
QUICK = ScaleSizes(20_000, 1_000, 3, 50, 2, 4.0, 1.0, 0.5, 250_000, 100_000, 120.0, naptime=1.0)


def sizes(bench: Bench) -> ScaleSizes:
    """The scale sizes that go with the bench's (quick or full); ``BENCH_GROWTH_BUDGET``
    (seconds) replaces the history growth's time budget."""
    chosen = QUICK if bench.sizes == scenarios.QUICK else FULL
    budget = os.environ.get("BENCH_GROWTH_BUDGET")
    return dataclasses.replace(chosen, load_budget=float(budget)) if budget else chosen


# A million periodic tasks ------------------------------------------------------------------------


def million(bench: Bench) -> list[Row]:
    """1,000,000 interval tasks: bulk load, idle tick, a replica's start-up pass, memory, edits.

    The idle tick is measured in this process (``scenarios.tick_cost``) before any replica runs
    and compared with the 1,000-task figure (the idle scenario's when it ran, else measured here
    first). Then one real replica: from its process start to its first full reconcile's log line,
    its resident memory once settled and its peak, and ``edits`` schedule edits saved one by one
    (``save()``, as the admin does) with the time from the save to the task's pending run at the
    new slot.
    """
    s = sizes(bench)
    low = bench.tick_costs.get(s.baseline)
    if low is None and len(bench.pool) <= s.baseline:
        bench.grow_pool(s.baseline)
        time.sleep(bench.sizes.settle / 2)
        low = bench.tick_costs[s.baseline] = scenarios.tick_cost(bench)
    started = time.perf_counter()
    first = len(bench.pool)
    bench.pool += data.interval_tasks("pool", first, s.tasks, timedelta(days=1))
    created = time.perf_counter() - started
    data.plan()
    planned = time.perf_counter() - started - created
    bench.log(f"  {s.tasks:,} tasks: created in {created:.1f} s, planned in {planned:.1f} s")
    time.sleep(bench.sizes.settle / 2)  # the bulk load's aftermath, as the idle scenario waits
    high = bench.tick_costs[s.tasks] = scenarios.tick_cost(bench)
    bench.log(f"  idle tick at {s.tasks:,} tasks: {high.describe()}; the slowest statements of"
              f" a pass: {high.slowest()}")
    deployment = bench.deployment("million")
    try:
        launched = time.time()
        deployment.start_beat("replica")
        ready = deployment.wait_for_log("replica", READY, timeout=300) - launched
        found = _first_full_pass(deployment, launched + STARTUP_CAP)
        startup = (time.time() - launched) if found else None
        rss, _ = settled_rss(deployment, "replica", bench.sizes.settle)
        edits = _edits(bench, s.edits)
        peak = rss_mb(deployment.processes["replica"].pid)[1]
    finally:
        close(bench, deployment)
    if found is None:
        failed = deployment.log_path("replica").read_text(errors="replace").count(
            "reconcile failed")
        started_text = (f"> {STARTUP_CAP:.0f} s (no full reconcile finished; {failed} failed"
                        f" passes logged)")
    else:
        started_text = f"{startup:.1f} s (beat ready {ready:.1f} s, pass {float(found[2]):.1f} s)"
    saves, replanned = [save for save, _ in edits], [after for _, after in edits]
    bench.log(f"  replica: start-up {started_text}, RSS {rss:.0f} MB (peak {peak:.0f} MB),"
              f" edits (save, re-planned after it) {[(round(a, 3), round(b, 3)) for a, b in edits]}")
    label = f"{s.tasks:,} periodic tasks"
    rows = [
        Row(label, "bulk create / plan (this process)", f"{created:.1f} s / {planned:.1f} s"),
        Row(f"idle tick, {s.tasks:,} tasks",
            "queries / DB time per tick (1 reconcile pass per 60 ticks)", high.describe(),
            target="<= 2 queries per tick", met=high.queries <= 2),
    ]
    if low is None:  # the pool outgrew 1,000 tasks before any 1,000-task figure was taken
        rows.append(Row(f"idle tick, {s.tasks:,} vs {s.baseline:,} tasks",
                        "DB time per tick ratio", "n/a (run the idle scenario too)"))
    else:
        rows.append(tick_ratio_row(high, low, s.tasks, s.baseline))
    rows += [
        Row(label, "start-up: process start to its first full reconcile done", started_text,
            target="<= 60 s", met=startup is not None and startup <= 60),
        Row(label, "RSS of one replica, settled (peak)", f"{rss:.0f} MB (peak {peak:.0f} MB)",
            target="<= 200 MB", met=peak <= 200),
        Row(label, f"one edit re-planned in the ledger, median / max of {len(edits)}",
            f"{ms(median(replanned))} / {ms(max(replanned))} (the save itself: median"
            f" {ms(median(saves))}, max {ms(max(saves))})", target="<= 1000 ms",
            met=max(replanned) <= 1.0),
    ]
    return rows


def _first_full_pass(deployment: Deployment, deadline: float) -> re.Match[str] | None:
    """Wait for the replica's first "full reconcile" line until ``deadline`` (``time.time()``);
    return its match (planned runs, seconds), or None (a pass that fails is logged and retried
    a reconcile interval later)."""
    path = deployment.log_path("replica")
    while time.time() < deadline:
        found = FULL_PASS.search(path.read_text(errors="replace"))
        if found is not None:
            return found
        if not deployment.alive("replica"):
            raise RuntimeError(f"the replica exited:\n{deployment.tail('replica')}")
        time.sleep(0.05)
    return None


def _edits(bench: Bench, count: int, timeout: float = 30.0) -> list[tuple[float, float]]:
    """Save ``count`` pool tasks with a new interval, one at a time; for each, the seconds the
    ``save()`` took (its triggers included) and the seconds from its commit until the task's
    pending scheduled run is at another slot (``timeout`` when it never is)."""
    rng = random.Random(17)
    rows = [
        IntervalSchedule.objects.get_or_create(every=86_400 + 60 * (i + 1),
                                               period=IntervalSchedule.SECONDS)[0]
        for i in range(count)
    ]
    took = []
    for row, pk in zip(rows, rng.sample(bench.pool, count), strict=True):
        time.sleep(rng.uniform(0.2, 1.2))  # a phase of its own against the replica's ticks
        pending = Run.objects.pending().scheduled().filter(periodic_task_id=pk)
        before = pending.values_list("scheduled_for", flat=True).get()
        task = PeriodicTask.objects.get(pk=pk)
        task.interval = row
        saving = time.monotonic()
        task.save()  # autocommit: committed when it returns
        saved = time.monotonic()
        while time.monotonic() - saved < timeout:
            if pending.exclude(scheduled_for=before).exists():
                break
            time.sleep(0.01)
        took.append((saved - saving, time.monotonic() - saved))
    return took


# A day's ledger: the built-in prune -------------------------------------------------------------


def day_ledger(bench: Bench) -> list[Row]:
    """``rate`` runs/s, the built-in prune on, then the same with it off; size and lateness.

    Each window: ``replicas`` real replicas, ``rate`` interval tasks every second (slots spread
    over the second, created while the replicas run, as the lateness scenario does); a thread
    of this process marks each dispatched run succeeded every second, as workers would record
    it (no worker runs ``rate`` tasks a second on this machine), so runs become prunable; the
    messages are taken off the broker as they arrive. With prune on, the replicas run with
    ``SCHEDULING_PRUNE_OLDER_THAN`` = ``retention`` (``bench.prune_settings``); the window opens
    after a warm-up of ``retention`` + 2 prune intervals (a steady state: runs older than the
    retention exist and are due for pruning) and two autovacuum rounds (the dead rows of the
    runs pruned so far reclaimed: the size a day's ledger keeps), the same warm-up for the window
    without prune. The ledger's size (rows and ``pg_total_relation_size``) is read at the
    window's start and end. Where the server runs with autovacuum off (this machine's CI
    configuration), the benchmark runs autovacuum's rule for the ledger itself (``_Autovacuum``):
    without it no deleted run's space is ever reused and the ledger grows by every run inserted,
    whatever the prune deletes.
    """
    s = sizes(bench)
    on = _ledger_window(bench, prune=True)
    off = _ledger_window(bench, prune=False)
    label = (f"day's ledger, {s.rate:,} runs/s, {s.replicas} replicas, {s.window:.0f} s windows,"
             f" prune older than {s.retention:.0f} s")
    rows = [on.size_row(label, "prune on", target=True),
            off.size_row(label, "prune off", target=False)]
    p99_on, p99_off = percentile(on.late, 0.99), percentile(off.late, 0.99)
    rows.append(Row(
        label, "prune on vs off: lateness p99 (ledger)",
        f"{ms(p99_on)} / {ms(p99_off)} ({len(on.late):,} / {len(off.late):,} runs)",
        ratio=f"{p99_on / p99_off:.2f}x" if p99_off else "", target="<= 1.2x prune off",
        met=bool(on.late) and bool(off.late) and p99_on <= 1.2 * p99_off,
    ))
    return rows


@dataclass(frozen=True)
class LedgerWindow:
    """One window of ``day_ledger``: the ledger's (rows, bytes) at its start and end, the runs
    the built-in prune deleted (from the replicas' logs, the whole deployment) and the lateness
    of each run with a slot in the window, seconds."""

    start: tuple[int, int]
    end: tuple[int, int]
    pruned: int
    late: list[float]
    vacuums: int  # VACUUMs of the ledger in the window, by autovacuum or by ``_Autovacuum``
    autovacuum: str  # who vacuumed: "the server's autovacuum" or what ran in its place

    def size_row(self, label: str, prune: str, target: bool) -> Row:
        (rows0, bytes0), (rows1, bytes1) = self.start, self.end
        grew_rows, grew_bytes = rows1 / rows0 - 1, bytes1 / bytes0 - 1
        return Row(
            label, f"ledger size, {prune}: window start -> end",
            f"{rows0:,} -> {rows1:,} rows ({grew_rows:+.1%}); {bytes0 / 2**20:.1f} ->"
            f" {bytes1 / 2**20:.1f} MB ({grew_bytes:+.1%}); prune deleted {self.pruned:,} runs;"
            f" {self.vacuums} vacuums ({self.autovacuum})",
            target="within 10 %" if target else "",
            met=(abs(grew_rows) <= 0.1 and abs(grew_bytes) <= 0.1) if target else None,
        )


def _ledger_window(bench: Bench, prune: bool) -> LedgerWindow:
    s = sizes(bench)
    kind = "prune-on" if prune else "prune-off"
    env = {}
    if prune:
        env = {"DJANGO_SETTINGS_MODULE": "bench.prune_settings",
               "BENCH_PRUNE_OLDER_THAN": str(s.retention),
               "BENCH_PRUNE_INTERVAL": str(s.prune_interval)}
    names = [f"replica-{i}" for i in range(1, s.replicas + 1)]
    data.clear_ledger()  # the window's ledger is its own: no run of earlier scenarios in it
    deployment = bench.deployment(f"day-ledger-{kind}")
    arrivals = Arrivals(bench.broker, deployment.queue).start()  # takes the messages off
    finisher = None
    autovacuum = _Autovacuum(s.naptime)
    try:
        for name in names:
            deployment.start_beat(name, **env)
        for name in names:
            deployment.wait_for_log(name, READY, timeout=120)
        base = ledger.database_now() + timedelta(seconds=3)
        task_ids = data.interval_tasks(
            f"day-ledger-{kind}", 0, s.rate, timedelta(seconds=1),
            start_time=lambda i: base + timedelta(seconds=i / s.rate),
        )
        w0 = base + timedelta(seconds=s.retention + 2 * s.prune_interval + 2 * autovacuum.naptime)
        finisher = _Finisher(task_ids, w0)
        sleep_until(w0)
        start, vacuums = _ledger_size(), _vacuums()
        w1 = w0 + timedelta(seconds=s.window)
        sleep_until(w1)
        end, vacuums = _ledger_size(), _vacuums() - vacuums
    finally:
        if finisher is not None:
            finisher.stop()
        autovacuum.stop()
        close(bench, deployment)
        arrivals.stop()
    PeriodicTask.objects.filter(pk__in=task_ids).update(enabled=False)
    pruned = sum(
        int(n) for name in names
        for n in PRUNED.findall(deployment.log_path(name).read_text(errors="replace"))
    )
    # The window's runs still in the ledger, and those the prune deleted after the finisher's
    # update (it finished every one of them: the prune deletes finished runs only).
    runs, _ = scenarios.lateness(w0, w1)
    seen = {task_id: (slot, dispatched) for task_id, slot, dispatched, _ in runs}
    seen.update((task_id, run) for task_id, run in finisher.dispatched.items() if run[0] < w1)
    late = [((dispatched or w1) - slot).total_seconds() for slot, dispatched in seen.values()]
    bench.log(f"  {kind}: ledger {start} -> {end}, pruned {pruned}, {len(late)} runs,"
              f" p99 {ms(percentile(late, 0.99))}, {vacuums} vacuums ({autovacuum.who})")
    return LedgerWindow(start, end, pruned, late, vacuums, autovacuum.who)


def _ledger_size() -> tuple[int, int]:
    """The run ledger's rows and total size in bytes (table, indexes, TOAST)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), pg_total_relation_size('scheduling_run')"
                       " FROM scheduling_run")
        rows, size = cursor.fetchone()
    return rows, size


def _vacuums() -> int:
    """How many times the ledger was vacuumed, by hand or by autovacuum (the server's counters)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # this transaction's view is fresh
        cursor.execute("SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables"
                       " WHERE relid = 'scheduling_run'::regclass")
        return cursor.fetchone()[0]


class _Autovacuum:
    """What PostgreSQL's autovacuum does for the ledger, done by the benchmark where the server
    runs with ``autovacuum = off``; where it is on, nothing (the server does it).

    Every ``naptime`` seconds (default: the server's ``autovacuum_naptime``) the rule of the
    server's own settings (PostgreSQL's documentation, "The Autovacuum Daemon"): VACUUM the ledger
    when its dead rows pass ``autovacuum_vacuum_threshold`` + ``autovacuum_vacuum_scale_factor``
    x its rows, or its rows inserted since the last vacuum pass the insert threshold and scale
    factor; ANALYZE it when its rows changed since the last analyze pass
    ``autovacuum_analyze_threshold`` + ``autovacuum_analyze_scale_factor`` x its rows. VACUUM is
    throttled as autovacuum's is (``autovacuum_vacuum_cost_delay``, its cost limit). Its own
    database session, in a thread.
    """

    RULE = (
        "SELECT s.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float"
        "   + current_setting('autovacuum_vacuum_scale_factor')::float * c.reltuples"
        " OR s.n_ins_since_vacuum > current_setting('autovacuum_vacuum_insert_threshold')::float"
        "   + current_setting('autovacuum_vacuum_insert_scale_factor')::float * c.reltuples,"
        " s.n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::float"
        "   + current_setting('autovacuum_analyze_scale_factor')::float * c.reltuples"
        " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
        " WHERE s.relid = 'scheduling_run'::regclass"
    )

    def __init__(self, naptime: float | None) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('autovacuum')::bool,"
                           " extract(epoch FROM current_setting('autovacuum_naptime')::interval)")
            on, server_naptime = cursor.fetchone()
        self.naptime = float(naptime if naptime is not None else server_naptime)
        self.who = ("the server's autovacuum" if on else
                    f"autovacuum off on the server: its rule run by the benchmark every"
                    f" {self.naptime:g} s")
        self._stop = threading.Event()
        self._thread = None
        if not on:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            with connection.cursor() as cursor:  # autovacuum's throttle, for this session
                cursor.execute(
                    "SELECT set_config('vacuum_cost_delay',"
                    " current_setting('autovacuum_vacuum_cost_delay'), false),"
                    " set_config('vacuum_cost_limit', CASE"
                    " WHEN current_setting('autovacuum_vacuum_cost_limit')::int > 0"
                    " THEN current_setting('autovacuum_vacuum_cost_limit')"
                    " ELSE current_setting('vacuum_cost_limit') END, false)"
                )
            while not self._stop.wait(self.naptime):
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_stat_clear_snapshot()")
                    cursor.execute(self.RULE)
                    vacuum, analyze = cursor.fetchone()
                    if vacuum or analyze:
                        cursor.execute(
                            "VACUUM (ANALYZE) scheduling_run" if analyze and vacuum
                            else "VACUUM scheduling_run" if vacuum else "ANALYZE scheduling_run"
                        )
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class _Finisher:
    """Marks the dispatched runs of some tasks succeeded once a second, as their workers would
    record them; its own database session, in a thread. ``dispatched`` keeps, per Celery task
    id, the (slot, dispatched at) of each run it finished with a slot at or after ``since``
    (aware datetimes): the prune deletes finished runs, so the ledger alone no longer has them."""

    SQL = (
        "UPDATE scheduling_run SET status = 'succeeded', started_at = dispatched_at,"
        " finished_at = clock_timestamp(), executions = 1"
        " WHERE status = 'dispatched' AND periodic_task_id = ANY(%s)"
        " RETURNING task_id, scheduled_for, dispatched_at"
    )

    def __init__(self, task_ids: list[int], since: datetime) -> None:
        self.task_ids = task_ids
        self.since = since
        self.dispatched: dict[str, tuple[datetime, datetime]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(1.0):
                with connection.cursor() as cursor:
                    cursor.execute(self.SQL, [self.task_ids])
                    for task_id, slot, dispatched in cursor.fetchall():
                        if slot >= self.since:
                            self.dispatched[task_id] = (slot, dispatched)
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# A day's ledger: the history grown -------------------------------------------------------------


def history_growth(bench: Bench) -> tuple[list[Row], dict[str, str]]:
    """Grow the history scenario's ledger to ``grown`` historical runs; time claim and poll again.

    ``scenarios.history`` must have run (its figures are the baseline). The runs are inserted by
    ``data.historical_runs`` in steps of ``block`` rows, continuing its row numbers; each step
    logs the rate and the projected time of the whole growth, and the growth stops before a step
    that would take it past ``load_budget`` seconds (the rows then say how far it got). Returns
    the rows and the plans at the grown size.
    """
    s = sizes(bench)
    start = bench.sizes.history
    before = bench.query_times[start]
    tasks = bench.pool[: bench.sizes.burst]
    loaded, began = start, time.perf_counter()
    while loaded < s.grown:
        block = min(s.block, s.grown - loaded)
        data.historical_runs(block, tasks, start=loaded, vacuum=False)
        loaded += block
        took = time.perf_counter() - began
        rate = (loaded - start) / took
        bench.log(f"  {loaded:,} historical runs, {rate:,.0f} rows/s; the growth to"
                  f" {s.grown:,} projected at {(s.grown - start) / rate / 60:.1f} min")
        if loaded < s.grown and took + min(s.block, s.grown - loaded) / rate > s.load_budget:
            bench.log(f"  stopped at {loaded:,} runs: the next step would pass"
                      f" {s.load_budget / 60:.0f} min")
            break
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE scheduling_run")
    bench.log(f"  grown to {loaded:,} runs in {time.perf_counter() - began:.0f} s (VACUUM"
              f" ANALYZE included); the ledger is {_ledger_size()[1] / 2**30:.1f} GiB")
    rows, plans = scenarios.ledger_queries(bench, loaded)
    after = bench.query_times[loaded]
    label = f"ledger, {loaded:,} vs {start:,} finished runs"
    for name in ("claim", "poll"):
        ratio = after[name] / before[name]
        rows.append(Row(label, f"time ratio, {name} query (medians of 20)",
                        f"{ms(after[name])} / {ms(before[name])}", ratio=f"{ratio:.2f}x",
                        target="<= 1.5x", met=ratio <= 1.5))
    return rows, {f"{name} with {loaded:,} runs": plan for name, plan in plans.items()}
