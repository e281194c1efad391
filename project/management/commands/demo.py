"""``manage.py demo``: beat replicas sharing the work, one worker and the admin, on one ledger.

The demo migrates, creates an ``admin`` login, starts N ``celery beat`` replicas (all running
``LedgerScheduler``), one worker and the admin as child processes, then creates three example
periodic tasks (once the replicas run, so their first runs are on time), and every few seconds
prints a summary read from the run ledger: runs dispatched per replica, duplicates (must be 0),
outcomes and lateness, and, as a check independent of the ledger, how many executions the
worker's own log shows and whether any task id ran twice.
``--kill-replica`` SIGKILLs, after about 15 s, the replica that has dispatched the most runs so
far, so the others visibly take over its work. It stops on Ctrl-C or after ``--duration``.

The summary counts only runs of the demo's own periodic tasks (named ``demo: ...``), so other
data in a shared database (``DATABASE_URL``) does not show up in it; lateness is that of
scheduled runs only, not of manual "run now" runs.

Children get ``DATABASE_URL`` and ``CELERY_BROKER_URL`` explicitly (computed once here from the
settings), so they all use the same database and broker, embedded or real. Their logs go to a
folder of their own per demo, named by its start time (UTC), under ``demo-logs/`` in the data
folder (``SCHEDULING_DATA_DIR``, default ``.data``): ``.data/demo-logs/2026-12-07_13-43-58/``;
the earlier demos' folders stay beside it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

from project import embedded
from scheduling import ledger
from scheduling.conf import conf
from scheduling.console import progress

from scheduling.models import Run

PREFIX = "demo: "
SUMMARY_EVERY = 5.0
KILL_AFTER = 15.0
#: How often to look again for a replica to kill when none has dispatched anything yet.
KILL_RETRY = 1.0
#: ``claimed_by`` of a run a worker adopted (its replica's claim rolled back after publishing).
ADOPTED = "adopted"
STOP_TIMEOUT = 10.0
#: The demo's last line on the embedded defaults: the server outlives it (the next demo or test
#: run joins it); ``./run stop`` stops it.
EMBEDDED_LEFT_RUNNING = (
    "the embedded PostgreSQL ({pgdata}) keeps running for the next run; ./run stop stops it"
)
#: What each kind of child logs once it is ready, and how long the start-up waits for it.
READY = {"replica": "beat: Starting...", "worker": "ready.", "admin": "Quit the server with"}
READY_TIMEOUT = 60.0
#: A task execution as Celery's worker logs it (success or failure; not retries or receipts).
EXECUTED = re.compile(r"Task [\w.]+\[([0-9a-f-]{36})\] (?:succeeded in|raised (?:un)?expected)")


class _Stop(Exception):
    """Raised by the SIGTERM/SIGHUP handler to stop the demo like Ctrl-C does."""


@dataclass
class Child:
    """One child process of the demo and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    expected_exit: bool = False
    reported: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Stats:
    """What the ledger says about the runs dispatched since the demo started."""

    per_replica: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    lateness: list[float] = field(default_factory=list)
    executions: Counter[str] = field(default_factory=Counter)

    @property
    def dispatched(self) -> int:
        return sum(self.per_replica.values())

    @property
    def repeated(self) -> int:
        """Task ids the worker executed more than once."""
        return sum(1 for n in self.executions.values() if n > 1)


def positive_seconds(value: str) -> float:
    """``--duration``'s type: seconds (a float) more than 0; argparse's error otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0:  # nan too
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {value}")
    return seconds


class Command(BaseCommand):
    help = (
        "Run the demo: N beat replicas with LedgerScheduler, one worker and the admin, printing "
        "a ledger summary every few seconds until Ctrl-C or --duration."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--duration", type=positive_seconds, default=None,
            help="Stop after this many seconds (default: run until Ctrl-C).",
        )
        parser.add_argument(
            "--kill-replica", action="store_true",
            help=(
                f"After about {KILL_AFTER:.0f} s, SIGKILL the replica that has dispatched the most "
                "runs so far; the others carry on."
            ),
        )
        parser.add_argument("--replicas", type=int, default=3, help="Beat replicas (default 3).")
        parser.add_argument("--port", type=int, default=8000, help="Admin port (default 8000).")

    def handle(self, *args: Any, **options: Any) -> None:
        replicas, port = options["replicas"], options["port"]
        if replicas < 1:
            raise CommandError("--replicas must be at least 1")
        if options["kill_replica"] and replicas < 2:
            raise CommandError("--kill-replica needs at least 2 replicas")
        _require_free_port(port)
        self.children: list[Child] = []
        self.logs = run_logs(embedded.data_dir() / "demo-logs", datetime.now(UTC))

        # Progress on a terminal: 4 set-up steps, then each child until it is ready.
        with progress("starting the demo", total=4 + replicas + 2) as advance:
            call_command("migrate", interactive=False, verbosity=0)
            advance(note="migrated")
            password = _admin_login()
            advance(note="admin login")
            self._prepare_broker()
            advance(note="broker")
            retired = retire_previous_tasks()
            since = ledger.database_now()
            previous = [signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)]
            try:
                self._start_children(replicas, port, advance)
            except (KeyboardInterrupt, _Stop) as exc:
                self._stop_children()
                signal.signal(signal.SIGTERM, previous[0])
                signal.signal(signal.SIGHUP, previous[1])
                raise CommandError("interrupted during start-up") from exc
            # Once the replicas run: a first slot due while none ran yet would be dispatched late.
            names = _example_tasks()
            advance(note="periodic tasks")
        self.say("migrated the database; periodic tasks: " + "; ".join(names))
        if retired:
            self.say(f"cancelled {retired} runs an earlier demo left pending")
        self.say("started " + ", ".join(f"{c.name} (pid {c.pid})" for c in self.children))
        try:
            self.say(f"admin: http://127.0.0.1:{port}/admin/  login: admin / {password}")
            self.say(f"logs:  {self.logs}/ (earlier demos' logs: {self.logs.parent}/)")
            self.say("Ctrl-C stops the demo (and --duration SECONDS stops it by itself)")
            self._watch(since, options["duration"], options["kill_replica"])
        except (KeyboardInterrupt, _Stop):
            self.say("stopping")
        finally:
            self._stop_children()
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGHUP, previous[1])
        final = self._stats(since)
        self.say("final: " + self._format(final))
        if final.lateness:
            self.say(
                f"final: lateness over the whole demo max {max(final.lateness):.3f} s, "
                f"mean {statistics.fmean(final.lateness):.3f} s over {len(final.lateness)} "
                "scheduled runs"
            )
        if not os.environ.get("DATABASE_URL"):
            self.say(EMBEDDED_LEFT_RUNNING.format(pgdata=embedded.pg_dir()))
        died = [c.name for c in self.children if not c.expected_exit and c.process.returncode]
        if final.duplicates or final.repeated:
            raise CommandError(
                f"{final.duplicates} duplicate runs in the ledger, "
                f"{final.repeated} task ids executed more than once by the worker"
            )
        if died:
            raise CommandError(f"child processes exited early: {', '.join(died)} (see {self.logs})")

    # Setup --------------------------------------------------------------------------------------

    def _prepare_broker(self) -> None:
        """Connect to the broker and declare the default queue once, before the children start.

        Fails early when the broker is unreachable, and with the embedded broker it creates its
        tables here instead of in N processes at once.
        """
        from project.celery import app

        queue = app.conf.task_default_queue
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=3)
            connection.default_channel.queue_declare(queue=queue, durable=True, auto_delete=False)

    def _start_children(self, replicas: int, port: int, ready: Callable[..., None]) -> None:
        """Start the beat replicas, the worker and the admin, each in its own session.

        Waits (up to READY_TIMEOUT seconds each) until each child logs that it is ready, calling
        ``ready(note=...)`` for each; a child that exits or stays silent is reported and the demo
        goes on (the watch loop reports exits).
        """
        env = {
            **os.environ,
            "DATABASE_URL": settings.DATABASE_URL,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "project.settings"),
            "PYTHONUNBUFFERED": "1",
        }
        celery = [sys.executable, "-m", "celery", "-A", "project"]
        for n in range(1, replicas + 1):
            name = f"replica-{n}"
            beat = [*celery, "beat", "-l", "info", "--pidfile="]
            self._spawn(name, beat, {**env, "SCHEDULING_REPLICA_ID": name})
        worker = [
            *celery, "worker", "-l", "info", "-c", "2",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        self._spawn("worker", worker, env)
        # --insecure serves the admin's static files with DEBUG off.
        admin = [
            sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--insecure",
        ]
        self._spawn("admin", admin, env)
        for child in self.children:
            ready(note=f"{child.name} {self._wait_ready(child)}")

    def _wait_ready(self, child: Child) -> str:
        """Wait until ``child`` logs its ready line; return "ready", "exited" or "not ready"."""
        marker = READY[child.name.split("-")[0]]
        path = self.logs / f"{child.name}.log"
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if marker in path.read_text(errors="replace"):
                return "ready"
            if child.process.poll() is not None:
                return "exited"
            time.sleep(0.1)
        return "not ready"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in _stop_children
        process = subprocess.Popen(
            argv, cwd=settings.BASE_DIR, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.children.append(Child(name, process, log))

    # Watching -----------------------------------------------------------------------------------

    def _watch(self, since: datetime, duration: float | None, kill_replica: bool) -> None:
        """Print a summary every SUMMARY_EVERY seconds; kill the busiest replica once if asked."""
        started = time.monotonic()
        next_summary = started + SUMMARY_EVERY
        window_start = since
        next_kill = started + KILL_AFTER if kill_replica else None
        while duration is None or time.monotonic() - started < duration:
            time.sleep(0.2)
            elapsed = time.monotonic() - started
            self._report_exits(elapsed)
            if next_kill is not None and time.monotonic() >= next_kill:
                next_kill = None if self._kill_busiest(since, elapsed) else next_kill + KILL_RETRY
            if time.monotonic() >= next_summary:
                now = ledger.database_now()
                stats = self._stats(since, window_start)
                self.say(f"[{elapsed:4.0f}s] " + self._format(stats, window=True))
                window_start, next_summary = now, next_summary + SUMMARY_EVERY

    def _kill_busiest(self, since: datetime, elapsed: float) -> bool:
        """SIGKILL the live replica with the most runs dispatched since ``since``, per the ledger.

        Returns False (try again later) while no live replica has dispatched anything yet.
        """
        counts = self._stats(since).per_replica
        alive = [
            c for c in self.children
            if c.name.startswith("replica-") and c.process.poll() is None
        ]
        if not alive:
            return True
        victim = max(alive, key=lambda c: counts.get(c.name, 0))  # the first replica on a tie
        count = counts.get(victim.name, 0)
        if count == 0:
            return False
        victim.expected_exit = True
        os.kill(victim.pid, signal.SIGKILL)
        self.say(
            f"[{elapsed:4.0f}s] killed {victim.name} (pid {victim.pid}) with SIGKILL: it had "
            f"dispatched {count} run{'' if count == 1 else 's'}, the most so far; "
            "the other replicas carry on"
        )
        return True

    def _report_exits(self, elapsed: float) -> None:
        for child in self.children:
            if child.process.poll() is not None and not child.reported:
                child.reported = True
                if not child.expected_exit:
                    self.say(
                        f"[{elapsed:4.0f}s] {child.name} exited with code "
                        f"{child.process.returncode}; see {self.logs / (child.name + '.log')}",
                        error=True,
                    )

    def _stats(self, since: datetime, window_start: datetime | None = None) -> Stats:
        """Read the ledger: runs dispatched since ``since``; lateness of those since ``window_start``.

        Only runs of the demo's own periodic tasks (names starting with ``PREFIX``) count, so other
        data in a shared database does not pollute the summary. Lateness is that of scheduled runs
        only (a manual run is due when requested). Executions are those runs' task ids as counted
        in the worker's log.

        Duplicates count (periodic task, scheduled_for) pairs of the demo's scheduled runs with more
        than one non-cancelled row over the whole ledger; the unique constraint keeps this at 0.
        """
        stats = Stats()
        demo_runs = Run.objects.filter(periodic_task_name__startswith=PREFIX)
        rows = demo_runs.filter(dispatched_at__gte=since).values_list(
            "claimed_by", "status", "trigger", "scheduled_for", "dispatched_at", "task_id"
        )
        window_start = window_start or since
        executed = _worker_executions(self.logs / "worker.log")
        for claimed_by, status, trigger, scheduled_for, dispatched_at, task_id in rows:
            if task_id in executed:
                stats.executions[task_id] = executed[task_id]
            stats.per_replica[self._replica_label(claimed_by)] += 1
            stats.statuses[status] += 1
            if trigger == Run.Trigger.SCHEDULE and dispatched_at >= window_start:
                stats.lateness.append((dispatched_at - scheduled_for).total_seconds())
        stats.duplicates = (
            demo_runs.filter(trigger=Run.Trigger.SCHEDULE)
            .exclude(status=Run.Status.CANCELLED)
            .values("periodic_task", "scheduled_for")
            .annotate(rows=Count("id"))
            .filter(rows__gt=1)
            .count()
        )
        return stats

    def _replica_label(self, claimed_by: str) -> str:
        """Name a replica as the demo does (replica-N), whether its id is that or ``host:pid``.

        A run dispatched with no ``claimed_by`` was adopted by the worker: its replica published
        it, then its claim rolled back (killed or stopped before committing).
        """
        for child in self.children:
            if claimed_by == child.name or claimed_by.endswith(f":{child.pid}"):
                return child.name
        return claimed_by or ADOPTED

    def _format(self, stats: Stats, window: bool = False) -> str:
        replicas = [c.name for c in self.children if c.name.startswith("replica-")]
        per_replica = " ".join(
            f"{name}={stats.per_replica.get(name, 0)}"
            for name in [*replicas, *sorted(set(stats.per_replica) - set(replicas))]
        )
        outcome = " ".join(
            f"{status}={stats.statuses.get(status, 0)}"
            for status in ("succeeded", "failed", "running", "dispatched")
        )
        text = (
            f"dispatched {stats.dispatched} ({per_replica}) | {outcome} | "
            f"duplicates {stats.duplicates} | worker executed {sum(stats.executions.values())}, "
            f"repeated {stats.repeated}"
        )
        if window:
            if stats.lateness:
                text += (
                    f" | lateness last {SUMMARY_EVERY:.0f}s: max {max(stats.lateness):.3f} s, "
                    f"mean {statistics.fmean(stats.lateness):.3f} s"
                )
            else:
                text += f" | no dispatch in the last {SUMMARY_EVERY:.0f}s"
        return text

    # Teardown -----------------------------------------------------------------------------------

    def _stop_children(self) -> None:
        """SIGTERM every child (warm shutdown), then SIGKILL what is left after STOP_TIMEOUT;
        the closing line names those that were still running (not a replica killed before)."""
        running = [c.name for c in self.children if c.process.poll() is None]
        for child in self.children:
            if child.process.poll() is None:
                child.expected_exit = True
                child.process.terminate()  # the worker's main process stops its own pool
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in {STOP_TIMEOUT:.0f} s; killing it")
                _signal_group(child, signal.SIGKILL)
                child.process.wait()
            # A worker's pool processes share its process group.
            _signal_group(child, signal.SIGKILL)
            child.log.close()
        if running:
            self.say("stopped " + ", ".join(running))

    def say(self, text: str, error: bool = False) -> None:
        """Print one line of the demo's output."""
        stream = self.stderr if error else self.stdout
        stream.write(text)
        stream.flush()


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signum)


def _signal_group(child: Child, signum: int) -> None:
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _worker_executions(log: Path) -> Counter[str]:
    """Count executions per task id in the worker's log: what ran, whatever the ledger says."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return Counter()
    return Counter(EXECUTED.findall(text))


def _require_free_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CommandError(f"port {port} is not free ({exc}); pass --port") from exc


def _admin_login() -> str:
    """Create the superuser ``admin`` (or reset its password); return the new random password."""
    password = secrets.token_urlsafe(12)
    user_model = get_user_model()
    user = user_model.objects.filter(username="admin").first()
    if user is None:
        user_model.objects.create_superuser("admin", "admin@example.com", password)
    else:
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
    return password


#: The demo's clocked one-off, recreated by every demo.
ONE_OFF = f"{PREFIX}one-off in 30 s"


def run_logs(root: Path, started: datetime) -> Path:
    """Make and return this demo's log folder: ``root`` / its start time (UTC, to the second).

    The folder name is ``2026-12-07_13-43-58``; a demo started within the same second as an
    earlier one gets ``_2``, ``_3`` ... after it. Earlier folders are left alone.
    """
    name = started.astimezone(UTC).strftime("%Y-%m-%d_%H-%M-%S")
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 100):
        folder = root / (name if attempt == 1 else f"{name}_{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise CommandError(f"cannot make a log folder for {name} in {root}")


#: Who the edit history says made the demo's own edits of its tasks (at each start: the previous
#: demo's tasks disabled, then set up and enabled again).
ACTOR = "the demo, at its start"


def retire_previous_tasks() -> int:
    """Before the replicas start: cancel the runs an earlier demo left pending (its tasks are
    disabled and the ledger reconciled), so a restart does not dispatch a stale, very late run,
    and delete its one-off (a one-off that ran once is over for good). Return how many runs
    were cancelled; the reconcile's own log line about them is kept out of the demo's output."""
    with ledger.acting(ACTOR):  # the edit history names the demo, not the SQL role
        PeriodicTask.objects.filter(name__startswith=PREFIX).update(enabled=False)
    pending = Run.objects.filter(periodic_task_name__startswith=PREFIX, status=Run.Status.PENDING)
    retired = pending.count()
    quiet = logging.getLogger("scheduling")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        ledger.reconcile(timedelta(seconds=conf.misfire_grace_seconds))
    finally:
        quiet.setLevel(level)
    for task in PeriodicTask.objects.filter(name=ONE_OFF).select_related("clocked"):
        clocked = task.clocked
        task.delete()
        if clocked is not None and not clocked.periodictask_set.exists():
            clocked.delete()
    return retired


def _example_tasks() -> list[str]:
    """Create the demo's periodic tasks by name (idempotently) and enable them; return the names.

    - ``demo: digest every 5 s``: an interval task sending an email to the console backend.
    - ``demo: record every minute``: a ``* * * * *`` crontab in UTC.
    - ``demo: one-off in 30 s``: a clocked one-off, 30 s ahead of the database clock.

    Called once the replicas run (``retire_previous_tasks`` went before them): the interval's
    first slot is 5 s after this save, and a slot due before any replica was up would be
    dispatched seconds late.
    """
    every_5s, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
    every_minute, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_month="*", month_of_year="*", day_of_week="*",
        timezone="UTC",
    )
    specs: dict[str, dict[str, Any]] = {
        f"{PREFIX}digest every 5 s": {
            "task": "project.tasks.send_digest", "interval": every_5s,
            "kwargs": '{"recipient": "team@example.com"}',
        },
        f"{PREFIX}record every minute": {
            "task": "project.tasks.record", "crontab": every_minute,
            "kwargs": '{"label": "every minute"}',
        },
    }
    clocked = ClockedSchedule.objects.create(
        clocked_time=ledger.database_now() + timedelta(seconds=30)
    )
    specs[ONE_OFF] = {
        "task": "project.tasks.record", "clocked": clocked, "one_off": True,
        "kwargs": '{"label": "one-off"}',
    }
    for name, fields in specs.items():
        with ledger.acting(ACTOR):
            task, _ = PeriodicTask.objects.get_or_create(name=name, defaults=fields)
            for key, value in fields.items():
                setattr(task, key, value)
            task.enabled = True
            task.save()  # moves date_changed (the interval's anchor) and tells the replicas
    return list(specs)
