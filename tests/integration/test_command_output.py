"""The commands as a shell runs them: one line per result, the terminal's width on a terminal.

Real ``manage.py`` processes with the example deployment's settings (its LOGGING puts the
``scheduling`` logger at INFO on stderr) on the test database: a command's result is its stdout
line, never repeated as a log line on stderr; ``scheduling_status`` on a pseudo-terminal of 72
columns fits in 72 columns.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import settings

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import test_database_url as database_url
from tests.conftest import utc

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        SCHEDULING_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    return env


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), capture_output=True,
        text=True, timeout=120, check=False,
    )


def test_run_now_prints_its_result_once(make_task):
    task = make_task(every=3600, name="demo: record every minute")
    done = _manage("run_now", task.name, "--requested-by", "ops")
    run = Run.objects.get(trigger=Run.Trigger.MANUAL)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"manual run {run.pk} of 'demo: record every minute' queued (Celery task id "
        f"{run.task_id}), requested by ops\n"
    )


def test_backfill_prints_its_result_once(make_task):
    task = make_task(every=60, name="demo: record every minute", start_time=utc(2026, 1, 5, 10))
    done = _manage(
        "backfill", task.name, "--since", "2026-01-05T10:00Z", "--until", "2026-01-05T10:03Z",
        "--requested-by", "ops",
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "backfill of 'demo: record every minute' from 2026-01-05 10:00:00 UTC until "
        "2026-01-05 10:03:00 UTC: 3 slots, 3 new runs, 0 already there\n"
    )


def test_pause_and_resume_print_their_result_once(make_task):
    task = make_task(every=3600, name="demo: digest every 5 s")
    paused = _manage("scheduling_pause", task.name, "--reason", "vendor down", "--by", "ops")
    assert (paused.returncode, paused.stderr) == (0, "")
    at = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"  # 2026-12-07 13:40:13.984 UTC
    assert re.fullmatch(rf"paused demo: digest every 5 s at {at} by ops\n", paused.stdout)
    resumed = _manage("scheduling_resume", task.name, "--by", "ops")
    assert (resumed.returncode, resumed.stderr) == (0, "")
    assert re.fullmatch(
        rf"resumed demo: digest every 5 s at {at} by ops: 0 slots skipped while paused\n",
        resumed.stdout,
    )


def test_backfill_warns_of_slots_from_before_the_task_was_created(make_task):
    from scheduling.models import TaskHistory

    task = make_task(cron="* * * * *", name="every minute")
    created = TaskHistory.objects.get(periodic_task_id=task.pk, operation="created").changed_at
    since = created.replace(second=0, microsecond=0) - timedelta(minutes=10)
    until = since + timedelta(minutes=2)
    done = _manage(
        "backfill", task.name, "--since", since.isoformat(), "--until", until.isoformat(),
        "--requested-by", "ops",
    )
    assert done.returncode == 0
    assert done.stderr == (
        f"warning: 2 slots of this range come before 'every minute' was created "
        f"({created:%Y-%m-%d %H:%M:%S} UTC): they are run although the task did not exist then\n"
    )
    assert done.stdout.endswith(": 2 slots, 2 new runs, 0 already there\n")

    again = _manage(  # the same range again: nothing is run, so nothing to warn about
        "backfill", task.name, "--since", since.isoformat(), "--until", until.isoformat(),
        "--requested-by", "ops",
    )
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.endswith(": 2 slots, 0 new runs, 2 already there\n")


def test_backfill_of_one_slot_says_slot_and_run_in_the_singular(make_task):
    task = make_task(every=3600, name="hourly", start_time=datetime(2026, 1, 1, tzinfo=UTC))
    args = ("--since", "2026-01-05T10:00:00+00:00", "--until", "2026-01-05T11:00:00+00:00")
    done = _manage("backfill", task.name, *args, "--requested-by", "ops")
    again = _manage("backfill", task.name, *args, "--requested-by", "ops")
    assert (done.returncode, done.stderr, again.returncode) == (0, "", 0)
    assert done.stdout.endswith(": 1 slot, 1 new run, 0 already there\n")
    assert again.stdout.endswith(": 1 slot, 0 new runs, 1 already there\n")


def test_prune_prints_its_counts_once(make_task):
    task = make_task(every=60)
    old = ledger.database_now() - timedelta(days=40)
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=old,
        status=Run.Status.SUCCEEDED, task_id="old-run", finished_at=old,
    )
    done = _manage("scheduling_prune", "--older-than", "30d")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[1:] == ["  succeeded          1", "deleted 1 runs"]


def _on_terminal(columns: int, *args: str) -> str:
    """Run ``manage.py args`` with stdin and stdout on a pseudo-terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=_env(), stdin=follower,
        stdout=follower, stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    return ANSI.sub("", b"".join(chunks).decode())


def test_status_on_a_terminal_fits_its_width(make_task):
    make_task(cron="30 2 * * *", timezone="Europe/Berlin", name="a nightly report for ops")
    make_task(every=5, name="a task name long enough to be wrapped in a narrow terminal")
    narrow = _on_terminal(72, "scheduling_status", "--upcoming", "2").splitlines()
    wide = _on_terminal(250, "scheduling_status", "--upcoming", "2").splitlines()
    piped = _manage("scheduling_status", "--upcoming", "2").stdout.splitlines()
    assert narrow[0].strip() == wide[0].strip() == piped[0] == "2 periodic tasks"
    assert 60 < max(len(line) for line in narrow) <= 72  # wrapped to the terminal's width
    # On a wide terminal and piped, the table at its natural width: no row wrapped.
    assert max(len(line) for line in wide) == max(len(line) for line in piped) > 72


def test_status_plain_names_each_tasks_overlap_policy_last(make_task):
    """Piped ``--format plain``: the header line, then each task's Buffered and Overlap cells,
    the overlap policy with its parameter; nothing on stderr."""
    make_task(every=60, name="a: allow")
    TaskPolicy.objects.create(
        periodic_task=make_task(every=60, name="b: buffer all"),
        overlap_policy=TaskPolicy.Overlap.BUFFER_ALL,
    )
    TaskPolicy.objects.create(
        periodic_task=make_task(every=60, name="c: replace"),
        overlap_policy=TaskPolicy.Overlap.REPLACE,
        replace_started=TaskPolicy.ReplaceStarted.TERMINATE,
    )
    done = _manage("scheduling_status", "--format", "plain")
    assert (done.returncode, done.stderr) == (0, "")
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    assert lines[0] == [
        "Task", "Schedule", "Enabled", "Paused", "Next run", "Last run", "Outcome", "Lateness",
        "Buffered", "Overlap",
    ]
    assert [(line[0], *line[-2:]) for line in lines[1:]] == [
        ("a: allow", "0", "allow"),
        ("b: buffer all", "0", "buffer all (limit 100)"),
        ("c: replace", "0", "replace (terminate)"),
    ]
