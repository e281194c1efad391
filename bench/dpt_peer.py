"""django-periodic-tasks as a peer of the correctness scenario, run as its README runs it.

django-periodic-tasks 0.2.1 needs Python 3.13 or later and Django's ``django.tasks`` (6.0), so it
runs in a virtualenv of its own, ``.venv-dpt`` (made here on first use, and again when
``bench/dpt/requirements.txt`` changes; the bench's own virtualenv is left as it is), with its
Django project ``bench.dpt`` (settings, the recording task) on the same database as the bench.

Its deployment: scheduler processes ``manage.py run_scheduler`` (one per container, as ours), each
claiming due tasks with ``SELECT ... FOR UPDATE SKIP LOCKED`` once per tick, and the database
backend's worker, django-tasks-db's ``manage.py db_worker``, as the READMEs say. The one option
set is the scheduler's tick, ``--interval 1`` (default 15 s): a scheduler sends a due task at its
next tick, once, and computes the next run from then, so a tick longer than the task's interval
sends only every few slots. 1 s is the shortest its integer option takes. The rest are the
defaults: a run enqueued and never completed is re-dispatched after 300 s, 3 attempts at most.

Interpreter: BENCH_DPT_PYTHON, else pyenv's newest 3.13, else ``python3.13`` on the PATH.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.acceptance.deployment import ROOT, Deployment

VENV = ROOT / ".venv-dpt"
REQUIREMENTS = ROOT / "bench" / "dpt" / "requirements.txt"
SETTINGS = "bench.dpt.settings"
#: The scheduler's tick in seconds (``run_scheduler --interval``): see the module docstring.
TICK = 1
#: What a scheduler logs per run it enqueues (to find the busiest one), and once it is up.
SENT = "Enqueued scheduled task: "
SCHEDULER_READY = "Periodic task scheduler starting"
WORKER_READY = "Starting worker worker_id="


def interpreter() -> str:
    """The Python 3.13 the virtualenv is made with (see the module docstring)."""
    if os.environ.get("BENCH_DPT_PYTHON"):
        return os.environ["BENCH_DPT_PYTHON"]
    versions = Path.home() / ".pyenv" / "versions"
    found = sorted((p for p in versions.glob("3.13.*") if re.fullmatch(r"3\.13\.\d+", p.name)),
                   key=lambda p: int(p.name.rsplit(".", 1)[1]))
    for folder in reversed(found):
        if (folder / "bin" / "python3.13").exists():
            return str(folder / "bin" / "python3.13")
    found_on_path = shutil.which("python3.13")
    if found_on_path is None:
        raise RuntimeError("django-periodic-tasks needs Python 3.13: none found (BENCH_DPT_PYTHON)")
    return found_on_path


def python() -> str:
    """``.venv-dpt``'s python, the virtualenv made and its requirements installed if needed.

    Reinstalls when the requirements file differs from the one last installed (kept in the
    virtualenv). Raises CalledProcessError with pip's output when the install fails.
    """
    binary = VENV / "bin" / "python"
    stamp = VENV / ".requirements"
    wanted = REQUIREMENTS.read_text()
    if binary.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(binary)
    # One maker at a time (two test processes of one run may both find it missing).
    with open(ROOT / ".venv-dpt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (binary.exists() and stamp.exists() and stamp.read_text() == wanted):
            if not binary.exists():
                subprocess.run([interpreter(), "-m", "venv", str(VENV)], check=True)
            subprocess.run([str(binary), "-m", "pip", "install", "--quiet",
                            "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
                           check=True, capture_output=True, text=True)
            stamp.write_text(wanted)
    return str(binary)


def _django(database_url: str, *args: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    result = subprocess.run([python(), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    if result.returncode:
        raise RuntimeError(f"django-periodic-tasks: {' '.join(args)} failed:\n{result.stderr}")


def migrate(database_url: str) -> None:
    """Create the peer's tables (its apps' migrations) in the database ``database_url`` names."""
    _django(database_url, "-m", "django", "migrate", "--verbosity", "0")


def create_tasks(database_url: str, prefix: str, tasks: int, every: int, anchor: float) -> None:
    """Scheduled tasks ``<prefix>-<i>`` every ``every`` s, the first run due at ``anchor``
    (``bench.dpt.schedule``: ``every`` divides 60, ``anchor`` is a multiple of it)."""
    _django(database_url, "-m", "bench.dpt.schedule", "create", prefix, str(tasks), str(every),
            repr(anchor))


def disable_tasks(database_url: str, prefix: str) -> None:
    """Disable the scheduled tasks ``<prefix>-*`` (schedulers of later runs leave them alone)."""
    _django(database_url, "-m", "bench.dpt.schedule", "disable", prefix)


def start_scheduler(deployment: Deployment, name: str) -> None:
    """Start a ``run_scheduler`` process ``name`` (ticking every ``TICK`` s)."""
    deployment.start_command(name, [python(), "-m", "django", "run_scheduler", "--interval",
                                    str(TICK)], SCHEDULER_READY, DJANGO_SETTINGS_MODULE=SETTINGS)


def start_worker(deployment: Deployment, name: str = "worker") -> None:
    """Start django-tasks-db's ``db_worker`` ``name`` (one process, one task at a time)."""
    deployment.start_command(name, [python(), "-m", "django", "db_worker"], WORKER_READY,
                             DJANGO_SETTINGS_MODULE=SETTINGS)


def waiting() -> int:
    """Runs enqueued and not yet taken by the worker (READY rows), read on this process's
    database connection (the bench's or the test's database, where the peer runs)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_tasks_database_dbtaskresult"
                       " WHERE status = 'READY'")
        return cursor.fetchone()[0]
