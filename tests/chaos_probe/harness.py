"""Chaos probe harness: beat replicas and workers as child processes against a chosen database.

Usage (from /work/main):  .venv/bin/python -m tests.chaos_probe.<experiment> <dbname>
Every child gets DATABASE_URL=.../<dbname>, Redis db 7 and a queue named chaos-<dbname>, so
`ps` filtering on the database name finds exactly our processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG = "postgresql://postgres@127.0.0.1:5432/"
BROKER = "redis://127.0.0.1:6379/7"


def setup_django(db: str) -> None:
    os.environ["DATABASE_URL"] = PG + db
    os.environ["CELERY_BROKER_URL"] = BROKER
    os.environ["CELERY_TASK_DEFAULT_QUEUE"] = f"chaos-{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


class Cluster:
    def __init__(self, db: str, workdir: Path, **env: str) -> None:
        self.db = db
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        for old in [*workdir.glob("*.log"), workdir / "executions.jsonl"]:
            old.unlink(missing_ok=True)
        self.queue = f"chaos-{db}"
        import redis

        redis.Redis.from_url(BROKER).delete(self.queue)  # our own queue only
        self.execution_log = workdir / "executions.jsonl"
        self.execution_log.touch()
        self.env = {
            **os.environ,
            "DATABASE_URL": PG + db,
            "CELERY_BROKER_URL": env.pop("CELERY_BROKER_URL", BROKER),
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "SCHEDULING_EXECUTION_LOG": str(self.execution_log),
            "PYTHONUNBUFFERED": "1",
            # HEAD's LOGGING (root handler on Celery's redirected stderr) drops every scheduling
            # log line in beat; use the previous LOGGING so the logs can be read (see report).
            "DJANGO_SETTINGS_MODULE": os.environ.get(
                "CHAOS_SETTINGS", "tests.chaos_probe.settings_oldlog"),
            **env,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.generation: dict[str, int] = {}

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        handle = open(self.log_path(name), "ab")  # noqa: SIM115
        handle.write(f"=== start {time.time():.3f}\n".encode())
        handle.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", *args],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        self.generation[name] = self.generation.get(name, 0) + 1
        return proc

    def start_beat(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            ["beat", "-l", "info", "--pidfile=", "-s", f"/tmp/chaos-{self.db}-{name}",
             "-S", "scheduling.schedulers:LedgerScheduler"],
            {"SCHEDULING_REPLICA_ID": f"{name}#{self.generation.get(name, 0) + 1}", **env},
        )

    def start_worker(self, name: str, concurrency: int = 4) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            ["worker", "-l", "info", "-c", str(concurrency), "-n", f"{name}-{self.db}@%h",
             "-Q", self.queue, "--without-gossip", "--without-mingle", "--without-heartbeat"],
            {},
        )

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def wait_log(self, name: str, text: str, timeout: float = 60.0, since: int = 0) -> float:
        deadline = time.monotonic() + timeout
        path = self.log_path(name)
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_text(errors="replace")[since:]:
                return time.time()
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not seen in {name}")

    def stop(self, *names: str, timeout: float = 20.0) -> None:
        targets = [self.procs[n] for n in names] if names else list(self.procs.values())
        for proc in targets:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in targets:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def executions(self) -> list[dict]:
        return [json.loads(l) for l in self.execution_log.read_text().splitlines() if l.strip()]


def make_tasks(n_interval: int = 44, n_cron: int = 4, n_clocked: int = 2, clocked_in: float = 30.0,
               prefix: str = "t") -> list:
    """~50 periodic tasks: intervals of 1-2 s, every-minute crontabs, clocked one-offs."""
    from datetime import timedelta

    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
    )

    from scheduling import ledger

    one, _ = IntervalSchedule.objects.get_or_create(every=1, period="seconds")
    two, _ = IntervalSchedule.objects.get_or_create(every=2, period="seconds")
    cron, _ = CrontabSchedule.objects.get_or_create(
        minute="*", hour="*", day_of_month="*", month_of_year="*", day_of_week="*", timezone="UTC"
    )
    tasks = []
    for i in range(n_interval):
        iv = one if i % 2 == 0 else two
        tasks.append(PeriodicTask.objects.create(
            name=f"{prefix}-every{iv.every}s-{i}", task="project.tasks.record", interval=iv,
            kwargs=json.dumps({"label": f"{prefix}-{i}"})))
    for i in range(n_cron):
        tasks.append(PeriodicTask.objects.create(
            name=f"{prefix}-minutely-{i}", task="project.tasks.record", crontab=cron,
            kwargs=json.dumps({"label": f"{prefix}-cron-{i}"})))
    now = ledger.database_now()
    for i in range(n_clocked):
        ck = ClockedSchedule.objects.create(clocked_time=now + timedelta(seconds=clocked_in + 5 * i))
        tasks.append(PeriodicTask.objects.create(
            name=f"{prefix}-clocked-{i}", task="project.tasks.record", clocked=ck, one_off=True,
            kwargs=json.dumps({"label": f"{prefix}-clocked-{i}"})))
    return tasks
