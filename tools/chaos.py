"""Chaos run: real replicas and workers killed, frozen and cut off at random; every slot checked.

    python -m tools.chaos --minutes 10 [--replicas 5] [--workers 2] [--tasks 200] [--seed N]

It uses the database and broker of the Django settings (``DJANGO_SETTINGS_MODULE``, default
``project.settings``: ``DATABASE_URL`` and ``CELERY_BROKER_URL``, as ``manage.py`` does), on a
queue of its own, and:

1. starts ``--replicas`` ``celery beat`` replicas with ``LedgerScheduler`` and ``--workers``
   workers (``tools.processes``);
2. creates ``--tasks`` periodic tasks named ``chaos-<id> ...`` running ``--task`` (default
   ``project.tasks.record``, which appends one JSON line per execution, and one when its body
   starts, to the file named by ``SCHEDULING_EXECUTION_LOG``): 80 % every ``--every`` seconds
   (10), 10 % ``* * * * *``, 10 % clocked one-offs inside the window (these two kinds run 2 s
   each); each gets worker-loss policy ``fail`` or ``recover`` (seeded);
3. for the window, at seeded random moments: SIGKILLs replicas and workers and restarts them,
   SIGSTOPs replicas for less and for more than ``cadences.IDLE_IN_TRANSACTION_TIMEOUT`` and
   workers for a few seconds, and ends replicas' database sessions with ``pg_terminate_backend``
   (found by ``application_name``, ``scheduling.ledger.application_name``); one replica is always
   left alone. In the broker (``tools.brokers``): purges the run's queue, cuts one process's
   broker connections, and on Redis flushes the database the URL names. Each fault is logged in
   ``faults.log``;
4. stops the faults, waits for every run of the window to finish, stops the replicas and then
   the workers (warm: what they execute finishes; ``quiesce``), and checks every slot of every
   task from its first slot to the end of the window (``check``): each slot either executed once
   (the worker's log, not the ledger), or is recorded with its reason (a coalesced misfire,
   missed, skipped, cancelled, expired, or failed with a reason such as "not delivered");
5. writes the run's history (every event of every run with the database clock, witnessed by a
   trigger the tool installs on the ledger for its own tasks: ``tools.capture``; ``--history``)
   and checks it with the history checker (``tools.history``);
6. prints the summary table, deletes its tasks and their runs, and exits 1 on any breach of
   either checker: a duplicate execution or slot row, an unaccounted or off-schedule slot, a run
   still pending, running or retrying, a run still dispatched (lost after dispatch), "worker
   lost" on a run whose body never started or of a ``recover`` task with re-publishes left, an
   execution of no run, a closed run without its reason, or a history breach.

The example project reads ``SCHEDULING_IDLE_IN_TRANSACTION_TIMEOUT``, ``SCHEDULING_RECONCILE_
INTERVAL``, ``SCHEDULING_WORKER_LOST_AFTER`` and ``SCHEDULING_DELIVERY_TIMEOUT`` from the
environment; the tool sets the last three to 5 s, 10 s and 10 s for its children unless they are
set (``ENV_DEFAULTS``), so a killed worker's run is closed, and a message lost in the broker
re-published, within the settling time.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.brokers import Broker
    from tools.capture import Capture
    from tools.history import Verdict
    from tools.processes import Processes

#: Bounds the tool gives its replicas unless the environment sets them (seconds).
ENV_DEFAULTS = {
    "SCHEDULING_WORKER_LOST_AFTER": "10",
    "SCHEDULING_RECONCILE_INTERVAL": "5",
    # A message lost in the broker is re-published this long after its dispatch, so that its
    # run executes within the settling time (the product's default is 5 minutes).
    "SCHEDULING_DELIVERY_TIMEOUT": "10",
    "CELERY_BROKER_VISIBILITY_TIMEOUT": "15",
    "CELERY_BROKER_RESTORE_INTERVAL": "1",
    "CELERY_BROKER_RESTORE_THROTTLE": "1",
}
UNFINISHED = ("pending", "dispatched", "running", "retrying")


@dataclass
class Options:
    """One chaos run. ``seconds`` is the length of the fault window; ``env`` goes to children."""

    seconds: float = 600.0
    replicas: int = 5
    workers: int = 2
    tasks: int = 200
    every: int = 10
    seed: int | None = None
    concurrency: int = 2
    fault_every: float = 3.0
    settle: float | None = None
    app: str = "project"
    task: str = "project.tasks.record"
    cwd: Path | None = None
    workdir: Path | None = None
    keep: bool = False
    env: dict[str, str] = field(default_factory=dict)
    #: Inject broker faults (queue purge, connection cut, Redis database flush; tools.brokers).
    broker_faults: bool = True
    #: The AMQP URL's vhost is the chaos run's own: a connection cut may close all its connections.
    own_vhost: bool = False
    #: Where the history goes (JSON lines, ``tools.history``); None: ``history.jsonl`` beside the
    #: processes' logs.
    history: Path | None = None


@dataclass
class Report:
    """What ``check`` found: outcomes per slot, breaches, lateness (seconds), faults injected."""

    outcomes: Counter[str] = field(default_factory=Counter)
    breaches: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    policies: Counter[str] = field(default_factory=Counter)  # tasks by worker-loss policy
    slots: int = 0
    #: The history checker's verdict on the run's history (``tools.history``), once checked.
    history: Verdict | None = None
    history_path: Path | None = None

    BREACHES = (
        "duplicate executions",
        "duplicate slot rows",
        "unaccounted slots",
        "stuck runs",
        "runs lost after dispatch",
        "worker lost without a start",
        "recover runs closed as worker lost",
        "off-schedule runs",
        "executions of no run",
        "closed without a reason",
        "processes that died on their own",
    )

    @property
    def duplicates(self) -> int:
        return self.breaches["duplicate executions"] + self.breaches["duplicate slot rows"]

    @property
    def unaccounted(self) -> int:
        return self.breaches["unaccounted slots"]

    @property
    def ok(self) -> bool:
        return not any(self.breaches.values()) and (self.history is None or self.history.ok)

    def breach(self, kind: str, example: str) -> None:
        self.breaches[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {example}")

    def table(self) -> str:
        """The summary: outcomes, breaches, lateness percentiles, faults, verdict."""
        rows = [("slots in the window", self.slots)]
        rows += [(f"  {k}", n) for k, n in sorted(self.outcomes.items(), key=lambda i: -i[1])]
        rows += [("breaches", sum(self.breaches.values()))]
        rows += [(f"  {k}", self.breaches[k]) for k in self.BREACHES]
        rows += [(f"tasks of worker-loss policy {k}", n) for k, n in sorted(self.policies.items())]
        rows += [("faults injected", sum(self.faults.values()))]
        rows += [(f"  {k}", n) for k, n in sorted(self.faults.items())]
        width = max(len(k) for k, _ in rows) + 2
        lines = [f"{k:<{width}}{v:>8}" for k, v in rows]
        if self.lateness:
            late = sorted(self.lateness)
            p = {q: late[min(len(late) - 1, int(q * len(late)))] for q in (0.5, 0.99)}
            lines.append(
                f"lateness (dispatched_at - scheduled_for) over {len(late)} runs: "
                f"p50 {p[0.5]:.3f} s, p99 {p[0.99]:.3f} s, max {late[-1]:.3f} s, "
                f"mean {statistics.fmean(late):.3f} s"
            )
        lines += self.examples
        if self.history is not None:
            lines.append(f"history {self.history_path}:")
            lines.append(self.history.summary())
        lines.append("result: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


@dataclass
class Planted:
    """A periodic task the run created, with its first slot (aware UTC) and its worker-loss
    policy (``fail`` or ``recover``, ``TaskPolicy.worker_lost_policy``)."""

    pk: int
    kind: str
    first_slot: datetime | None
    policy: str = "fail"


def run(options: Options, say: Callable[[str], None] = print) -> Report:
    """Run the chaos (Django must be set up); return the report. Children get ``options.env``."""
    from scheduling import ledger
    from tools.capture import Capture
    from tools.processes import Processes

    rng = random.Random(options.seed)
    ident = f"chaos-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    shout = say

    def say(line: str) -> None:
        shout(f"[{time.monotonic() - started:4.0f}s] {line}")

    workdir = options.workdir or Path(tempfile.mkdtemp(prefix=f"{ident}-"))
    env = {**{k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}, **options.env}
    procs = Processes(workdir / ident, queue=ident, app=options.app, cwd=options.cwd, env=env)
    say(f"{ident}: logs in {procs.workdir}, seed {options.seed}")
    replicas = [f"{ident}-replica-{n}" for n in range(1, options.replicas + 1)]
    workers = [f"{ident}-worker-{n}" for n in range(1, options.workers + 1)]
    planted: list[Planted] = []
    report = Report()
    capture = Capture(ident)
    capture.install()
    try:
        for name in replicas:
            procs.start_beat(name)
        for name in workers:  # the session's application_name names the worker in the history
            procs.start_worker(name, concurrency=options.concurrency, PGAPPNAME=name)
        procs.wait_ready(timeout=120)
        planted = _plant(ident, options, rng)
        report.policies.update(p.policy for p in planted)
        broker = _broker(ident, options, env) if options.broker_faults else None
        say(f"{ident}: {len(planted)} periodic tasks, faults for {options.seconds:g} s; broker "
            f"faults: {', '.join(broker.kinds) if broker else 'none'}")
        faults = Faults(procs, replicas, workers, rng, _idle_timeout(env), broker,
                        purge_patience=options.every + 0.5)
        faults.run_for(options.seconds, options.fault_every)
        end = ledger.database_now()
        report.faults = faults.counts
        for name in replicas + workers:
            if not procs.alive(name):
                report.breach("processes that died on their own", procs.tail(name, 5))
        settle = options.settle or (
            max(_float(env, "SCHEDULING_WORKER_LOST_AFTER", 60.0),
                _float(env, "SCHEDULING_DELIVERY_TIMEOUT", 300.0))
            + 2 * _float(env, "SCHEDULING_RECONCILE_INTERVAL", 60.0) + 60
        )
        say(f"{ident}: faults stopped; settling (giving up after {settle:g} s without progress)")
        settle_window(ident, end, settle)
        quiesce(procs, replicas, workers)
        check(
            ident, planted, end, procs.executions(), report, faults.killed_groups,
            starts=procs.executions("start"), republish_limit=_republish_limit(env),
            kills=faults.kills,
        )
        report.history_path = options.history or procs.workdir / "history.jsonl"
        report.history = write_history(report.history_path, capture, procs, faults.killed, end)
        say(f"{ident}: history of {sum(report.history.events.values())} events in "
            f"{report.history_path}")
        if report.breaches["stuck runs"] or report.breaches["runs lost after dispatch"]:
            for line in _whereabouts(ident, end, procs, env):
                say(line)
    finally:
        procs.stop()
        capture.remove()
        if not options.keep:
            _clean(ident, runs=report.ok)
            say(f"{ident}: {_drain(ident, options, env)}")
            if options.workdir is None and report.ok:
                shutil.rmtree(workdir, ignore_errors=True)
        if not report.ok:
            say(f"{ident}: logs kept in {procs.workdir}; runs kept in the ledger")
    return report


def write_history(
    path: Path, capture: Capture, procs: Processes, killed: list[dict[str, object]],
    end: datetime,
) -> Verdict:
    """Write the run's history to ``path`` and check it (``tools.history``).

    The events: the ledger's changes witnessed by ``capture`` (``tools.capture.Capture``), one
    ``executed`` event per line of the workers' execution log that ends a body (its ``db_at``,
    the database clock the task read as it wrote the line), and ``killed`` (the workers the
    tool SIGKILLed, each with its process group and the database clock once it was dead), and
    ``window`` (``end``, aware UTC: the runs of later slots were still being dispatched when the
    tool stopped its processes).
    """
    from tools import capture as witness
    from tools import history

    records = list(witness.events(capture.changes()))
    records += [
        {"kind": "executed", "at": line.get("db_at"), "process": f"process group {line.get('pgid')}",
         "task_id": line.get("task_id"), "pgid": line.get("pgid"), "pid": line.get("pid"),
         "task": line.get("periodic_task_name"), "slot": line.get("scheduled_for")}
        for line in procs.executions()
    ]
    records += killed
    records.append({"kind": "window", "at": history.instant(end), "process": "chaos",
                    "until": history.instant(end)})
    witness.write(path, records)
    return history.check(records)


def _drain(ident: str, options: Options, env: dict[str, str]) -> str:
    """Empty the run's queue once its processes are stopped: re-published copies of runs that
    had executed are left in it, and on the SQL broker they stay in its table for good."""
    try:
        return f"{_broker(ident, options, env).purge()} messages left in its queue, purged"
    except Exception as exc:  # noqa: BLE001 - cleanup only: the broker may be what failed
        return f"its queue could not be purged: {type(exc).__name__}: {exc}"


def _float(env: dict[str, str], name: str, default: float) -> float:
    value = env.get(name) or os.environ.get(name)
    return float(value) if value else default


def _republish_limit(env: dict[str, str]) -> int:
    from scheduling.conf import conf

    return int(_float(env, "SCHEDULING_REPUBLISH_LIMIT", conf.republish_limit))


def _broker(ident: str, options: Options, env: dict[str, str]) -> Broker:
    """The children's broker (their CELERY_BROKER_URL), with the run's queue."""
    import importlib

    from django.conf import settings

    from tools.brokers import Broker

    importlib.import_module(options.app)  # registers the app's transports (project.broker)
    return Broker(
        env.get("CELERY_BROKER_URL") or os.environ.get("CELERY_BROKER_URL")
        or settings.CELERY_BROKER_URL, ident,
        transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None),
        own_vhost=options.own_vhost,
    )


def _idle_timeout(env: dict[str, str]) -> float:
    from scheduling import cadences

    default = cadences.IDLE_IN_TRANSACTION_TIMEOUT
    return _float(env, "SCHEDULING_IDLE_IN_TRANSACTION_TIMEOUT", default)


def _plant(ident: str, options: Options, rng: random.Random) -> list[Planted]:
    """Create the tasks: 80 % every ``options.every`` s, 10 % every minute, 10 % clocked ones."""
    import json

    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
    )

    from scheduling import ledger, slots
    from scheduling.models import TaskPolicy

    # Worker-loss policies from a stream of their own, so they do not move the faults' draws.
    policy_rng = random.Random(rng.getrandbits(64))
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=options.every, period=IntervalSchedule.SECONDS
    )
    minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_month="*", month_of_year="*", day_of_week="*",
        timezone="UTC",
    )
    start = ledger.database_now()
    planted = []
    for n in range(options.tasks):
        kind = "crontab * * * * *" if n % 10 == 8 else ("clocked" if n % 10 == 9 else "interval")
        name = f"{ident} #{n} {kind}"
        fields: dict[str, object] = {"interval": interval}
        if kind.startswith("crontab"):
            fields = {"crontab": minute}
        elif kind == "clocked":
            at = start + timedelta(seconds=rng.uniform(3, max(4, options.seconds - 3)))
            fields = {"clocked": ClockedSchedule.objects.create(clocked_time=at), "one_off": True}
        # The rare ones run 2 s, so that killed workers are caught mid-run.
        kwargs = {"label": name, "sleep": 0 if kind == "interval" else 2, "log_start": True}
        task = PeriodicTask.objects.create(
            name=name, task=options.task, queue=ident, kwargs=json.dumps(kwargs), **fields
        )
        policy = policy_rng.choice((TaskPolicy.WorkerLost.FAIL, TaskPolicy.WorkerLost.RECOVER))
        TaskPolicy.objects.create(periodic_task=task, worker_lost_policy=policy)
        first = slots.initial_run(task, task.date_changed, last_slot=None, grace=timedelta(0))
        planted.append(Planted(task.pk, kind, first, str(policy)))
    return planted


class Faults:
    """Injects faults at seeded random moments and undoes them (SIGCONT, restart) on time."""

    def __init__(
        self, procs: Processes, replicas: list[str], workers: list[str], rng: random.Random,
        idle_timeout: float, broker: Broker | None = None, purge_patience: float = 0.0,
    ) -> None:
        self.procs = procs
        self.purge_patience = purge_patience  # seconds a purge waits for a message to purge
        self.broker = broker
        self.replicas, self.workers = replicas, workers
        self.rng = rng
        self.idle = idle_timeout
        self.counts: Counter[str] = Counter()
        self.killed_groups: set[int] = set()  # process groups of the workers SIGKILLed
        self.kills: list[tuple[str, datetime]] = []  # (worker, database time once it was dead)
        self.killed: list[dict[str, object]] = []  # the same as history events (tools.history)
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.busy: set[str] = set()  # dead or paused, with an undo timer pending
        self.spared = replicas[0]  # one replica is always left running
        self.log_path = procs.workdir / "faults.log"  # one line per fault and undo, timestamped

    def note(self, line: str) -> None:
        """Append ``line`` to the faults log, stamped like Celery's log lines (local time)."""
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        stamp += f",{int(now % 1 * 1000):03d}"
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"[{stamp}] {line}\n")

    def run_for(self, seconds: float, every: float) -> None:
        """Inject faults for ``seconds``, one every ``every`` s on average; then undo them all.

        In the second half of the window a fault kind not injected yet goes first, so that a
        short window still has every kind that had a victim.
        """
        deadline = time.monotonic() + seconds
        halfway = deadline - seconds / 2
        next_fault = time.monotonic() + self.rng.expovariate(1 / every)
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._undo_due(now)
            if now >= next_fault:
                self.inject(new_first=now >= halfway)
                next_fault = now + self.rng.expovariate(1 / every)
            time.sleep(0.05)
        for _, undo in sorted(self.timers, key=lambda t: t[0]):
            undo()
        self.timers.clear()

    def _undo_due(self, now: float) -> None:
        """Undo the faults whose time has come (SIGCONT, restart)."""
        for due, undo in sorted(self.timers, key=lambda t: t[0]):
            if due <= now:
                self.timers.remove((due, undo))
                undo()

    def _later(self, delay: float, undo: Callable[[], None]) -> None:
        self.timers.append((time.monotonic() + delay, undo))

    def inject(self, new_first: bool = False) -> None:
        """Inject one fault, chosen by weight among those that have a free victim (with
        ``new_first``, among the kinds not injected yet when there are some)."""
        replicas = [r for r in self.replicas if r != self.spared and r not in self.busy]
        workers = [w for w in self.workers if w not in self.busy]
        kinds = {
            "replica SIGKILL + restart": (3, replicas),
            "replica SIGSTOP < idle timeout": (2, replicas),
            "replica SIGSTOP > idle timeout": (1, replicas),
            "replica sessions terminated": (2, [r for r in self.replicas if r not in self.busy]),
            "worker SIGKILL + restart": (2, workers),
            "worker SIGSTOP": (1, workers),
        }
        broker = self.broker.kinds if self.broker is not None else []
        if "purge" in broker:
            kinds["broker queue purged"] = (1, ["queue"])
        if "cut" in broker and self.broker.cuts_all:
            kinds["broker connections cut"] = (2, ["all"])
        elif "cut" in broker:
            kinds["broker connections of a replica cut"] = (
                1, [r for r in self.replicas if r not in self.busy]
            )
            kinds["broker connections of a worker cut"] = (1, workers)
        if "flush" in broker:
            kinds["broker database flushed"] = (1, ["database"])
        choices = [(k, w, v) for k, (w, v) in kinds.items() if v]
        if new_first and any(k not in self.counts for k, _, _ in choices):
            choices = [(k, w, v) for k, w, v in choices if k not in self.counts]
        if not choices:
            return
        kind, _, victims = self.rng.choices(choices, weights=[w for _, w, _ in choices])[0]
        victim = self.rng.choice(victims)
        self.note(f"{kind}: {victim}")
        if "SIGKILL" in kind:
            if kind.startswith("worker"):
                self.killed_groups.add(self.procs.processes[victim].pid)
            self.procs.kill(victim)
            if kind.startswith("worker"):
                self._note_killed(victim)
            self._hold(victim, self.rng.uniform(0.5, 3.0), self.procs.restart)
        elif "SIGSTOP" in kind:
            if kind.startswith("worker"):
                pause = self.rng.uniform(0.5, 5.0)
            elif "<" in kind:
                pause = self.rng.uniform(0.3, 0.8 * self.idle)
            else:
                pause = self.idle + self.rng.uniform(1.0, 5.0)
            self.procs.send(victim, signal.SIGSTOP)
            self._hold(victim, pause, lambda v: self.procs.send(v, signal.SIGCONT))
        elif kind.startswith("broker"):
            if not self._broker_fault(kind, victim):
                return
        elif not self._terminate(victim):
            return
        self.counts[kind] += 1

    def _note_killed(self, worker: str) -> None:
        """The history's ``killed`` event of ``worker``, dead now: the database clock after the
        kill, so that every line its bodies wrote is before it (``tools.history``)."""
        from scheduling.ledger import database_now
        from tools.history import instant

        dead = database_now()
        self.kills.append((worker, dead))
        self.killed.append({
            "kind": "killed", "at": instant(dead), "process": worker,
            "pgid": self.procs.processes[worker].pid,
        })

    def _purge(self) -> int:
        """Purge the run's queue, again every 20 ms until a purge removed a message or
        ``purge_patience`` seconds passed (the run's: its tasks' interval and a half); return how
        many were removed. A slot's messages wait in the queue for milliseconds before the
        workers take them, so a purge at a random moment mostly found it empty and lost nothing:
        no fault."""
        assert self.broker is not None
        until = time.monotonic() + self.purge_patience
        purged = self.broker.purge()
        while not purged and time.monotonic() < until:
            time.sleep(0.02)
            self._undo_due(time.monotonic())  # a stopped process is let go on time meanwhile
            purged = self.broker.purge()
        return purged

    def _broker_fault(self, kind: str, victim: str) -> bool:
        """Inject broker fault ``kind`` (on ``victim``'s connections for a cut); True if done."""
        from tools.brokers import process_group

        assert self.broker is not None
        try:
            if kind == "broker queue purged":
                self.note(f"  {self._purge()} messages purged")
            elif kind == "broker database flushed":
                self.note(f"  {self.broker.flush()} keys flushed")
            else:
                pids = set() if victim == "all" else process_group(self.procs.processes[victim].pid)
                cut = self.broker.cut(pids)
                self.note(f"  {cut} connections cut")
                return cut > 0
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is no fault
            self.note(f"  not injected: {type(exc).__name__}: {exc}")
            return False
        return True

    def _hold(self, victim: str, delay: float, undo: Callable[[str], object]) -> None:
        self.busy.add(victim)

        def release() -> None:
            self.note(f"undo: {victim}")
            undo(victim)
            self.busy.discard(victim)

        self._later(delay, release)

    def _terminate(self, replica: str) -> int:
        """End ``replica``'s scheduler sessions with pg_terminate_backend; return how many."""
        from django.db import connection

        from scheduling.ledger import application_name

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                [application_name(replica)],
            )
            return int(cursor.fetchone()[0])


def settle_window(ident: str, end: datetime, stall: float) -> None:
    """Wait until no run of the window (``scheduled_for`` up to ``end``, aware UTC) is pending,
    dispatched, running or retrying.

    Progress is a run finishing or a run re-published: under a backlog the reconcile passes take
    the overdue runs in turns, a run closes "not delivered" only after its last re-publish, and
    the workers may spend minutes on copies of runs that already ran (seen on the SQL broker at
    load 30: 600 runs re-published, none finishing for 74 s, reported lost). Re-publishes are
    bounded per run, so this ends. Gives up when neither happened for ``stall`` seconds (the
    checker then reports the runs left), or after ten times that.
    """
    from django.db.models import Sum

    from scheduling.models import Run

    window = Run.objects.filter(periodic_task_name__startswith=f"{ident} ", scheduled_for__lte=end)
    unfinished = window.filter(status__in=UNFINISHED)

    def state() -> tuple[int, int]:
        republished = window.aggregate(n=Sum("republished"))["n"] or 0
        return unfinished.count(), republished

    start = last_progress = time.monotonic()
    left, republished = state()
    while left and time.monotonic() - last_progress < stall and (
        time.monotonic() - start < 10 * stall
    ):
        time.sleep(0.5)
        now_left, now_republished = state()
        if now_left < left or now_republished > republished:
            last_progress = time.monotonic()
        left, republished = min(left, now_left), max(republished, now_republished)
    time.sleep(1.0)  # a duplicate execution, if any, would be logged by now


def quiesce(procs: Processes, replicas: list[str], workers: list[str]) -> None:
    """Stop the run's children before the check reads the ledger and the workers' log.

    Replicas first (SIGTERM: no run planned or dispatched after that), then workers with a warm
    shutdown (the runs they are executing finish, each writing its log line before the guard
    records it succeeded). While they ran, a run closed "not delivered" whose late message a
    worker took could be recorded succeeded after the log was read: the check then counted it
    as "succeeded, not in the execution log" (seen in a 10-minute run on Redis, 7 of 10,022
    slots).
    """
    for names, warm in ((replicas, False), (workers, True)):
        if names:  # stop() with no name stops every process
            procs.stop(*names, warm=warm)


def _whereabouts(
    ident: str, end: datetime, procs: Processes, env: dict[str, str]
) -> list[str]:
    """Where the message of each run left unfinished is: the workers' log lines naming its task
    id, and what the broker holds of it (``Broker.locate``). Also written to ``whereabouts.log``
    in the logs folder."""
    from django.conf import settings

    from scheduling.models import Run
    from tools.brokers import Broker

    stuck = list(Run.objects.filter(
        periodic_task_name__startswith=f"{ident} ", scheduled_for__lte=end, status__in=UNFINISHED
    ).order_by("scheduled_for"))
    url = env.get("CELERY_BROKER_URL") or settings.CELERY_BROKER_URL
    try:
        summary, found = Broker(url, ident).locate([run.task_id for run in stuck])
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the broker may be the problem
        summary, found = f"broker: cannot look ({type(exc).__name__}: {exc})", {}
    lines = [summary] if summary else []
    for run in stuck:
        lines.append(f"{run.task_id} {run.periodic_task_name} {run.scheduled_for:%H:%M:%S} "
                     f"{run.status} dispatched_at {run.dispatched_at} by {run.claimed_by}, "
                     f"re-published {run.republished}x")
        for name, kind in procs.kinds.items():
            path = procs.log_path(name)
            if kind == "worker" and path.exists():
                lines += [f"  {name}: {line}" for line in path.read_text(errors="replace")
                          .splitlines() if run.task_id in line][:5]
        if run.task_id in found:
            lines.append(f"  broker: {found[run.task_id]}")
    with open(procs.workdir / "whereabouts.log", "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return lines


def check(
    ident: str, planted: list[Planted], end: datetime, executions: list[dict[str, object]],
    report: Report, killed_groups: set[int] = frozenset(),  # type: ignore[assignment]
    *, starts: list[dict[str, object]] | None = None, republish_limit: int | None = None,
    kills: list[tuple[str, datetime]] = (),  # type: ignore[assignment]
) -> Report:
    """Account for every slot of ``planted`` up to ``end`` (aware UTC) in ``report``.

    Each expected slot (the task's first slot, then ``slots.next_run`` from each slot) gets one
    outcome: "executed once" (succeeded, and its task id appears once in ``executions``, the
    workers' "end" lines), a coalesced slot (inside a late run's ``slots``), or the closed status
    with its reason. Anything else is a breach (``Report.BREACHES``). Executions of slots after
    ``end`` only count towards duplicates and executions of no run.

    A run executed again because the worker executing it was SIGKILLed (``killed_groups``, the
    process groups of the killed workers, against each execution's ``pgid``) and its message was
    redelivered is not a duplicate: that is the guard's rule (docs/semantics.md). Two executions
    by workers that were not killed are.

    Invariant 9 (no run lost after dispatch, docs/delivery.md): a run still ``dispatched`` is a
    run lost after dispatch (its message lost in the broker or on a dead consumer and never
    recovered); one re-published and executed, or closed with a reason ("not delivered"), is
    accounted for. "Worker lost" is accepted only for a task of worker-loss policy ``fail``
    (``Planted.policy``) whose body really started (a "start" line in ``starts``); a run of a
    ``recover`` task closed "worker lost" before it was re-published ``republish_limit`` times
    (``SCHEDULING_REPUBLISH_LIMIT``) is a breach.

    The one exception: a ``fail`` run the guard had started (``started_at``) whose worker was
    SIGKILLed (``kills``: worker name and the database time read once it was dead) within
    ``BODY_GAP`` after, before the body's first line was written. The time is read after the
    kill, not before: a start between a reading before and the signal (0.2 s apart at load 15,
    seen in a 30-minute RabbitMQ run) would otherwise look like a start after the kill. The guard's start is the last step before the
    body (Celery calls the body right after ``before_start``), so a death in between cannot be
    told from a death in the body's first statements by anything but the task's own log, and the
    product treats it as lost mid-body; it is counted as its own outcome, not a breach.
    """
    from django_celery_beat.models import PeriodicTask

    from scheduling import slots
    from scheduling.conf import conf
    from scheduling.models import Run

    executed = Counter(str(e["task_id"]) for e in executions)
    survived = Counter(str(e["task_id"]) for e in executions if e.get("pgid") not in killed_groups)
    for task_id, n in executed.items():
        if survived[task_id] > 1:
            report.breach("duplicate executions", f"task id {task_id} executed {n} times")
    killed: dict[str, list[datetime]] = defaultdict(list)
    for worker, when in kills:
        killed[worker].append(when)
    evidence = _Evidence(
        executed, Counter(str(e["task_id"]) for e in starts or []),
        conf.republish_limit if republish_limit is None else republish_limit, killed,
    )
    runs = list(
        Run.objects.filter(periodic_task_name__startswith=f"{ident} ").order_by("scheduled_for")
    )
    known = {run.task_id for run in runs}
    for task_id in executed.keys() - known:
        report.breach("executions of no run", task_id)
    by_task: dict[int | None, list[Run]] = defaultdict(list)
    for run in runs:
        by_task[run.periodic_task_id].append(run)
        if run.dispatched_at is not None and run.trigger == "schedule" and run.scheduled_for <= end:
            report.lateness.append((run.dispatched_at - run.scheduled_for).total_seconds())
    tasks = PeriodicTask.objects.in_bulk([p.pk for p in planted])
    for plant in planted:
        expected: list[datetime] = []
        slot = plant.first_slot
        while slot is not None and slot <= end:
            expected.append(slot)
            slot = None if plant.kind == "clocked" else slots.next_run(tasks[plant.pk], slot)
        _account(expected, by_task[plant.pk], end, evidence, plant.policy, report)
    return report


#: Longest time between the guard's start of a run and its worker's SIGKILL for which a missing
#: start line is taken to be the gap before the body's first line (see ``check``): that gap is
#: the guard's COMMIT reply and a few statements, which a busy machine stretches to milliseconds.
BODY_GAP = timedelta(seconds=2)


@dataclass(frozen=True)
class _Evidence:
    """What the workers logged, per task id ("end" and "start" lines), the re-publish limit, and
    when each worker was SIGKILLed (database clock)."""

    executed: Counter[str]
    started: Counter[str]
    republish_limit: int
    kills: dict[str, list[datetime]] = field(default_factory=dict)

    def killed_before_its_body(self, run: object) -> bool:
        """Whether the worker that started ``run`` was SIGKILLed within BODY_GAP after the start."""
        started = run.started_at  # type: ignore[attr-defined]
        worker = (run.worker or "").split("@")[0]  # type: ignore[attr-defined]
        return started is not None and any(
            timedelta(0) <= when - started <= BODY_GAP for when in self.kills.get(worker, ())
        )


def _account(
    expected: list[datetime], runs: list[object], end: datetime, evidence: _Evidence,
    policy: str, report: Report,
) -> None:
    rows: dict[datetime, list] = defaultdict(list)
    for run in runs:
        if run.trigger == "schedule":  # type: ignore[attr-defined]
            rows[run.scheduled_for].append(run)  # type: ignore[attr-defined]
    covered = 0  # later slots a coalesced run or a counting missed row stands for
    for slot in expected:
        report.slots += 1
        here = rows.pop(slot, [])
        live = [r for r in here if r.status != "cancelled"]
        cancelled = [r for r in here if r.status == "cancelled"]
        if covered and not live:
            covered -= 1
            report.outcomes["coalesced into a late run"] += 1
            continue
        if len(live) > 1:
            report.breach("duplicate slot rows", f"{live[0]} and {len(live) - 1} more")
        if not live:
            if cancelled and cancelled[0].reason:
                report.outcomes[f"cancelled: {cancelled[0].reason}"] += 1
            else:
                report.breach("unaccounted slots", f"{slot.isoformat()} of task {runs[:1]}")
            continue
        covered = max(covered, live[0].slots - 1)
        report.outcomes[_outcome(live[0], evidence, policy, report)] += 1
    for slot, extra in rows.items():
        if slot <= end and any(r.status != "cancelled" for r in extra):
            report.breach("off-schedule runs", str(extra[0]))


def _outcome(run: object, evidence: _Evidence, policy: str, report: Report) -> str:
    """The outcome label of one run, recording a breach when it is not accounted for."""
    from scheduling.models import Run

    status, reason = run.status, run.reason  # type: ignore[attr-defined]
    times = evidence.executed[run.task_id]  # type: ignore[attr-defined]
    starts = evidence.started[run.task_id]  # type: ignore[attr-defined]
    republished = run.republished  # type: ignore[attr-defined]
    if status == "dispatched":
        report.breach("runs lost after dispatch", f"{run} task id {run.task_id} "  # type: ignore
                      f"(re-published {republished}x; {reason or 'no reason'})")
        return "lost after dispatch"
    if status in UNFINISHED:
        report.breach("stuck runs", f"{run} ({reason or 'no reason'})")
        return f"stuck {status}"
    if status == "succeeded":
        if times == 0:
            report.breach("unaccounted slots", f"{run}: succeeded, not in the execution log")
        if times > 1:
            return "executed again: its worker was killed, the message redelivered"
        if starts > 1:
            return f"executed once more after its worker was lost mid-body ({policy})"
        if republished:
            return "executed once, after a re-publish"
        return "executed once" if run.slots == 1 else "executed once, coalescing a misfire"
    if status == "failed" and reason == Run.Reason.WORKER_LOST:
        if policy == "recover" and republished < evidence.republish_limit:
            report.breach("recover runs closed as worker lost", f"{run} task id "
                          f"{run.task_id} (re-published {republished}x of "  # type: ignore
                          f"{evidence.republish_limit})")
        elif starts == 0 and evidence.killed_before_its_body(run):
            return f"failed: worker lost, killed before its body's first line ({policy})"
        elif starts == 0:
            report.breach("worker lost without a start", f"{run} task id "
                          f"{run.task_id} ({policy}): its body never began")  # type: ignore
        return f"failed: worker lost ({policy}), executed {times}x"
    if status == "failed" and (reason or run.error):  # type: ignore[attr-defined]
        return f"failed: {reason or 'task error'}, executed {times}x"
    if status != "failed" and times == 0 and reason:
        return f"{status}: {reason.split(':')[0]}"
    report.breach("closed without a reason", f"{run} executed {times}x, reason {reason!r}")
    return f"{status} without a reason"


def _clean(ident: str, runs: bool = True) -> None:
    """Delete the run's periodic tasks, their clocked rows and (``runs``) their ledger rows."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    from scheduling.models import Run

    tasks = PeriodicTask.objects.filter(name__startswith=f"{ident} ")
    clocked = list(tasks.exclude(clocked=None).values_list("clocked_id", flat=True))
    if runs:
        Run.objects.filter(periodic_task_name__startswith=f"{ident} ").delete()
    tasks.delete()
    ClockedSchedule.objects.filter(pk__in=clocked).delete()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print the table; 0 when every slot is accounted for."""
    parser = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__.split(
        "\n")[0])
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--minutes", type=float, help="length of the fault window (default 10)")
    window.add_argument("--seconds", type=float, help="length of the fault window in seconds")
    parser.add_argument("--replicas", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes per worker")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--every", type=int, default=10,
                        help="interval of 80 %% of the tasks, seconds (default 10; 1 s for 200 "
                        "tasks is 180 runs/s, more than two cores run)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fault-every", type=float, default=3.0,
                        help="mean seconds between two faults (default 3)")
    parser.add_argument("--settle", type=float, default=None,
                        help="most seconds to wait for the window's runs to finish")
    parser.add_argument("--app", default="project", help="Celery app for celery -A")
    parser.add_argument("--task", default="project.tasks.record",
                        help="task run by every periodic task; it must log executions like "
                        "project.tasks.record")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for logs")
    parser.add_argument("--keep", action="store_true", help="keep the tasks and runs")
    parser.add_argument("--no-broker-faults", action="store_true",
                        help="no queue purge, connection cut or Redis database flush")
    parser.add_argument("--history", type=Path, default=None,
                        help="write the run's history (JSON lines) here; default: history.jsonl "
                        "beside the logs, removed with them when the run passes")
    parser.add_argument("--own-vhost", action="store_true",
                        help="the AMQP URL's vhost is this run's own: a connection cut may close "
                        "every connection on it (rabbitmqctl close_all_connections)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes or 10)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import django

    django.setup()
    unapplied = unapplied_migrations()
    if unapplied:
        parser.exit(2, f"the database has {len(unapplied)} unapplied migrations (first:"
                    f" {unapplied[0]}): run `python manage.py migrate` first\n")
    options = Options(
        seconds=seconds, replicas=args.replicas, workers=args.workers, tasks=args.tasks,
        every=args.every, seed=seed, concurrency=args.concurrency, fault_every=args.fault_every,
        settle=args.settle, app=args.app, task=args.task, workdir=args.workdir, keep=args.keep,
        broker_faults=not args.no_broker_faults, own_vhost=args.own_vhost, history=args.history,
    )
    report = run(options, say=lambda line: print(line, flush=True))
    print(report.table(), flush=True)
    return 0 if report.ok else 1


def unapplied_migrations() -> list[str]:
    """The migrations not applied to the default database, as ``app.name``, in plan order."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


if __name__ == "__main__":
    sys.exit(main())
