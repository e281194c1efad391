"""Issue 17's scenarios over minutes: a sustained rate, and an MVCC horizon held meanwhile.

- ``sustained``: 2 replicas dispatch 2,000 interval tasks every second (slots spread over the
  second) for 5 minutes: lateness from the ledger, every run once at the broker, every slot
  dispatched as a run of its own, and the CPU the replicas and PostgreSQL used per 1,000 runs.
- ``mvcc_horizon``: 2 replicas dispatch 500 runs a second for 10 minutes while another session
  keeps a REPEATABLE READ snapshot of the ledger open, so no dead tuple the claims leave behind
  can be vacuumed (the known failure of SKIP LOCKED queues): lateness over the whole window, the
  claim query's time at its start and at its end, and the ledger's dead tuples at the end.

Both measure lateness the way ``scenarios.lateness_and_storm`` does (the ledger's
``dispatched_at - scheduled_for``, cross-checked with when each message reached the broker).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from django.db import connection, transaction
from django_celery_beat.models import PeriodicTask

from bench import data, scenarios
from bench.env import Arrivals, cpu_seconds, machine_cpu, postgres_cpu_seconds
from bench.profile import profiled
from bench.report import Row, median, ms
from bench.scenarios import (
    NO_WORKER,
    Bench,
    captured,
    lateness,
    lateness_rows,
    per_thousand,
    sleep_until,
    timed,
)
from scheduling import cadences, ledger
from scheduling.ledger.claim import claim_due
from scheduling.models import Run
from tests.acceptance.deployment import Deployment, test_database_url

REPLICAS = 2
#: Executions of the claim query timed at each end of the horizon's window (their median).
CLAIM_TIMINGS = 10


@dataclass(frozen=True)
class Sizes:
    """Runs per second (interval tasks due every second) and seconds measured, per scenario."""

    sustained_rate: int
    sustained_window: float
    horizon_rate: int
    horizon_window: float


FULL = Sizes(2_000, 300.0, 500, 600.0)
QUICK = Sizes(100, 8.0, 50, 10.0)


def _sizes(bench: Bench) -> Sizes:
    return QUICK if bench.sizes == scenarios.QUICK else FULL


@dataclass
class Steady:
    """One window of interval tasks due every second on ``REPLICAS`` replicas.

    ``since`` is the window's start, once every task has its first run planned; the caller sets
    ``until``. ``arrivals`` (every message's arrival times by task id, None when the broker cannot
    tell) is filled in when the window ends.
    """

    deployment: Deployment
    names: list[str]
    task_ids: list[int]
    since: datetime
    until: datetime | None = None
    arrivals: dict[str, list[float]] | None = field(default=None, repr=False)

    @property
    def pids(self) -> list[int]:
        return [self.deployment.processes[name].pid for name in self.names]


@contextmanager
def _steady(bench: Bench, label: str, rate: int) -> Iterator[Steady]:
    """Start the replicas, then create ``rate`` tasks every second while they run (they plan them
    from the change log), first slots spread over the second a few seconds ahead; yield once
    every task has its first run planned and a second more has passed.

    On the way out: waits until every run with a slot before ``until`` was claimed (60 s at
    most), stops the replicas, collects the broker's arrivals and disables the tasks.
    """
    names = [f"replica-{i}" for i in range(1, REPLICAS + 1)]
    deployment = bench.deployment(label, **NO_WORKER)
    arrivals = Arrivals(bench.broker, deployment.queue).start()
    task_ids: list[int] = []
    try:
        for name in names:
            deployment.start_beat(name)
        deployment.wait_ready(*names, timeout=120)
        base = ledger.database_now() + timedelta(seconds=3)
        task_ids = data.interval_tasks(
            label, 0, rate, timedelta(seconds=1),
            start_time=lambda i: base + timedelta(seconds=i / rate),
        )
        planned = Run.objects.scheduled().filter(periodic_task_id__in=task_ids)
        deadline = time.monotonic() + 120
        while planned.values("periodic_task_id").distinct().count() < rate:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the replicas did not plan {rate} tasks in 120 s")
            time.sleep(0.2)
        since = max(base, ledger.database_now()) + timedelta(seconds=1)
        bench.log(f"  {label}: {rate} tasks planned; window from {since:%H:%M:%S}")
        steady = Steady(deployment, names, task_ids, since)
        sleep_until(since)
        yield steady
        late = planned.filter(status=Run.Status.PENDING, scheduled_for__lt=steady.until)
        deadline = time.monotonic() + 60
        while late.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        deployment.stop()
        seen = arrivals.stop()
        bench.broker.delete(deployment.queue)
    steady.arrivals = seen
    PeriodicTask.objects.filter(pk__in=task_ids).update(enabled=False)


def sustained(bench: Bench) -> list[Row]:
    """2,000 runs a second for 5 minutes on 2 replicas: lateness, the broker's count, CPU per run.

    Targets (issue 17): lateness p99 <= 50 ms and max <= 500 ms, every run once at the broker.
    The CPU of the replicas (``/proc``) and of the PostgreSQL server (every process of it, so also
    other databases' sessions on a shared server) from the window's start to its end, per 1,000
    runs with a slot in the window, is a figure beside them; and the machine's limit: how many of
    its cores every process kept busy over the window (``/proc/stat``), beside what raw kombu's
    publish alone would take at this rate (its CPU per message from ``burst``).
    """
    s = _sizes(bench)
    label = (f"sustained, {s.sustained_rate:,} runs/s, {REPLICAS} replicas,"
             f" {s.sustained_window:.0f} s")
    with _steady(bench, "sustained", s.sustained_rate) as steady:
        replicas, server = sum(map(cpu_seconds, steady.pids)), postgres_cpu_seconds()
        machine, cores = machine_cpu()
        steady.until = steady.since + timedelta(seconds=s.sustained_window)
        with profiled(bench.profile, "sustained", steady.pids):
            sleep_until(steady.until)
        replicas = sum(map(cpu_seconds, steady.pids)) - replicas
        after = postgres_cpu_seconds()
        machine = machine_cpu()[0] - machine
        server = None if server is None or after is None else after - server
    window = lateness(steady.since, steady.until)
    runs = len(window[0])
    rows = lateness_rows(label, window, steady.arrivals, p99=0.050, max_late=0.500)
    rows.append(_slots_row(label, steady, s.sustained_rate, s.sustained_window))
    database = "" if server is None else f" + PostgreSQL {per_thousand(server, runs)}"
    rows.append(Row(label, f"CPU per 1,000 runs: {REPLICAS} replicas (+ PostgreSQL)",
                    f"{per_thousand(replicas, runs)}{database}" if runs else "0 runs"))
    window_s = s.sustained_window
    parts = f"replicas {replicas / window_s:.2f}" + (
        "" if server is None else f", PostgreSQL {server / window_s:.2f}")
    rows.append(Row(
        label, "the machine's limit: cores busy over the window, every process",
        f"{machine / window_s:.2f} of {cores} ({parts})",
        raw="" if bench.publish_cpu is None else
        f"kombu's publish alone at {s.sustained_rate:,}/s:"
        f" {bench.publish_cpu * s.sustained_rate:.2f} cores",
    ))
    bench.log(f"  sustained: {runs:,} runs, replicas' CPU {replicas:.1f} s,"
              f" PostgreSQL CPU {'not on this host' if server is None else f'{server:.1f} s'}")
    return rows


def mvcc_horizon(bench: Bench) -> list[Row]:
    """500 runs a second for 10 minutes on 2 replicas while another session holds the horizon.

    The other session is a plain psycopg connection that opens a REPEATABLE READ transaction and
    reads the ledger at the window's start, then sits in it until the window's end: its snapshot
    keeps the xmin horizon back, so neither vacuum nor index scans can remove the dead versions
    each claim leaves of the runs it updates. Targets (issue 17): lateness p99 over the window
    <= 100 ms, and the claim query's server time per due run it reads at the end <= 2x the same
    at the start (``ClaimTime``: per due run, since the replicas claim beside it and how many are
    due at that instant varies: a run alone read 215 buffers for 15 due runs at the start and
    930 for 27 at the end). The prepared claim's client-side time, as the scheduler sends it,
    and the ledger's dead tuples at the end (``pg_stat_user_tables``) are figures. Raises RuntimeError when the session did not hold the horizon to the end.
    """
    s = _sizes(bench)
    label = (f"MVCC horizon held {s.horizon_window:.0f} s, {s.horizon_rate:,} runs/s,"
             f" {REPLICAS} replicas")
    with connection.cursor() as cursor:  # start from a ledger whose dead tuples are vacuumed
        cursor.execute("VACUUM ANALYZE scheduling_run")
    with _steady(bench, "horizon", s.horizon_rate) as steady, _holder() as holder:
        start = _claim_time()
        steady.until = steady.since + timedelta(seconds=s.horizon_window)
        with profiled(bench.profile, "mvcc_horizon", steady.pids):
            sleep_until(steady.until)
        end = _claim_time()
        dead = _dead_tuples()
        held = _horizon_age(holder)
    for moment, claim in (("start", start), ("end", end)):  # where the buffers went
        (bench.workdir / f"mvcc-horizon-claim-{moment}.json").write_text(claim.plan)
    bench.log(f"  mvcc_horizon: claim {_described(start)} at the start, {_described(end)} at the"
              f" end; {dead:,} dead tuples; the snapshot was {held:,} transactions old"
              f" (plans: {bench.workdir}/mvcc-horizon-claim-*.json)")
    rows = lateness_rows(label, lateness(steady.since, steady.until), steady.arrivals, p99=0.100)
    rows.append(_slots_row(label, steady, s.horizon_rate, s.horizon_window))
    measured = start.per_run is not None and end.per_run is not None
    rows.append(Row(
        label, f"claim server time per due run at the start / end (median of {CLAIM_TIMINGS}"
               " EXPLAIN ANALYZE)",
        (f"{start.per_run * 1e6:.1f} / {end.per_run * 1e6:.1f} us ({start.buffers_per_run:.1f} /"
         f" {end.buffers_per_run:.1f} buffers per due run; {start.due:.0f} / {end.due:.0f} due)"
         if measured else "n/a: no due run read"),
        ratio=f"{end.per_run / start.per_run:.2f}x" if measured else "",
        target="end <= 2x start", met=measured and end.per_run <= 2 * start.per_run,
    ))
    rows.append(Row(label, "claim time at the start / end (prepared, as a replica sends it,"
                           f" median of {CLAIM_TIMINGS})", f"{ms(start.seconds)} / {ms(end.seconds)}"))
    rows.append(Row(label, "dead tuples of scheduling_run at the end (n_dead_tup)", f"{dead:,}"))
    return rows


def _slots_row(label: str, steady: Steady, rate: int, window: float) -> Row:
    """Whether every slot of the window was dispatched as a run of its own.

    The window holds ``rate`` slots for each of its seconds. A run later than the misfire grace
    period (60 s by default) is coalesced, one run standing for every slot up to then (the
    default misfire policy), so the rest never reach the ledger, nor the broker, as runs of
    their own: the lateness rows and the broker's count see only the runs.
    """
    due = rate * round(window)
    alone = Run.objects.scheduled().filter(
        scheduled_for__gte=steady.since, scheduled_for__lt=steady.until,
        status=Run.Status.DISPATCHED, slots=1,
    ).count()
    return Row(label, "slots dispatched as a run each (ledger)",
               f"{alone:,} of {due:,} ({alone / window:,.0f} runs/s); {due - alone:,} coalesced"
               " or not dispatched", target="all", met=alone == due)


@contextmanager
def _holder() -> Iterator[psycopg.Connection]:
    """A session of its own in a REPEATABLE READ transaction that has read the ledger."""
    with psycopg.connect(test_database_url()) as holder:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM scheduling_run").fetchone()
        try:
            yield holder
        finally:
            holder.rollback()


def _horizon_age(holder: psycopg.Connection) -> int:
    """Transactions since the holder's snapshot, which must still hold the xmin horizon."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
            [holder.info.backend_pid],
        )
        row = cursor.fetchone()
    in_transaction = holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    if not in_transaction or row is None or row[0] is None:
        raise RuntimeError("mvcc_horizon: the other session did not hold its snapshot to the end")
    return int(row[0])


@dataclass(frozen=True)
class ClaimTime:
    """The claim query's cost at one moment, per due run it read.

    ``seconds``: its client-side time as a replica sends it (prepared, generic plan; median).
    From ``CLAIM_TIMINGS`` runs of ``EXPLAIN (ANALYZE, BUFFERS)`` of it that read a due run
    (of at most ten times as many), the medians: ``per_run``, the server's execution time
    (seconds) over the due runs the pending index gave (``due``: the replicas claim beside it,
    so how many are due at that instant varies, and the claim's cost grows with it),
    ``buffers_per_run`` (shared hit and read) and ``due``; None when none read one.
    """

    seconds: float
    per_run: float | None
    buffers_per_run: float | None
    due: float | None
    #: The plan of the last EXPLAIN that read a due run, as ``FORMAT JSON`` gave it.
    plan: str = ""


def _claim_time() -> ClaimTime:
    """Time the claim query, as a replica sends it, with what is due now: from the due floor a
    full poll sets (``ledger.DueFloor``), on a generic plan."""
    poll, floor = ledger.poll(), ledger.DueFloor()
    floor.seen(poll.now, poll.next_due, full=True)
    sql, params = captured(lambda: claim_due(cadences.BATCH_SIZE, "default", floor.value))
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")  # as a replica's session
    try:
        seconds = median([timed(sql, params, prepared=True) for _ in range(CLAIM_TIMINGS)])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET plan_cache_mode")
    samples, last = [], ""
    for _ in range(10 * CLAIM_TIMINGS):  # until CLAIM_TIMINGS of them read a due run
        if len(samples) == CLAIM_TIMINGS:
            break
        with transaction.atomic(), connection.cursor() as cursor:  # rolled back: no claim kept
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            result = cursor.fetchone()[0]
            transaction.set_rollback(True)
        plan = (json.loads(result) if isinstance(result, str) else result)[0]
        due = _due_read(plan["Plan"])
        if due:
            top = plan["Plan"]
            buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
            samples.append((plan["Execution Time"] / 1000 / due, buffers / due, due))
            last = json.dumps(plan, indent=1)
    if not samples:
        return ClaimTime(seconds, None, None, None)
    per_run, buffers, due = (median([sample[i] for sample in samples]) for i in range(3))
    return ClaimTime(seconds, per_run, buffers, due, last)


def _due_read(node: dict) -> int:
    """The rows the plan read from the pending runs' index (``scheduling_run_pending_due``)."""
    rows = (node["Actual Rows"] * node["Actual Loops"]
            if node.get("Index Name") == "scheduling_run_pending_due" else 0)
    return rows + sum(_due_read(child) for child in node.get("Plans", []))


def _described(claim: ClaimTime) -> str:
    if claim.per_run is None:
        return f"{ms(claim.seconds)} (no due run read by {10 * CLAIM_TIMINGS} EXPLAINs)"
    return (f"{ms(claim.seconds)} (server {claim.per_run * 1e6:.1f} us and"
            f" {claim.buffers_per_run:.1f} buffers per due run, {claim.due:.0f} due)")


def _dead_tuples() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'scheduling_run'"
        )
        return int(cursor.fetchone()[0])
