"""Issue 13, acceptance 4: the README's LOGGING snippet prints each dispatch line exactly once.

A new user's path, with real processes: ``django-admin startproject`` in a temporary folder, an
app with the README's task module, the README's Celery app module, the settings the README's
install section names and the README's LOGGING snippet pasted as it is. The project gets a
database of its own on this test's PostgreSQL server (``migrate`` builds it) and this test's
broker (Redis or RabbitMQ as configured, on a queue of its own; with the embedded defaults,
kombu's SQL transport on that database). A periodic task every second is created, a real
``celery -A mysite beat -S scheduling.schedulers:LedgerScheduler`` runs until the ledger has
several dispatched runs, and is stopped. Then every dispatched run's line ("dispatched <name>
(task id <id>), lateness ...") must be in beat's output exactly once, and the task ids in the
output must be those the ledger (``scheduling.models.Run``) has as dispatched for that task.

The install guide (docs/install.md, once the README's install section) marks each block the test
takes with ``<!-- readme-test: <name> -->`` on the line before its fence.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.acceptance import deployment

pytestmark = [pytest.mark.acceptance]

#: The install guide, moved out of the README (issue 33): the blocks below are its own.
README = deployment.ROOT / "docs" / "install.md"
TASK_NAME = "readme: digest every second"
#: Dispatched runs to wait for before stopping beat (the first slot is one second after the
#: task is created; beat then dispatches one run a second).
RUNS = 4
#: Generous bound for a loaded two-core machine: beat's start-up plus RUNS seconds.
DEADLINE = 120.0

#: Environment variables of this test run that must not reach the new project (its settings
#: module, our database and broker, this virtualenv).
_NOT_PASSED = ("DJANGO_", "DATABASE_URL", "CELERY_", "SCHEDULING_", "VIRTUAL_ENV", "PYTHONPATH")
_ENV = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}

#: A marked block: the marker line, then a fenced block (indented as a whole, or not).
_BLOCK = re.compile(
    r"^<!-- readme-test: (?P<name>[\w-]+) -->\n"
    r"(?P<indent>[ ]*)```\w*\n(?P<body>.*?)\n(?P=indent)```",
    re.MULTILINE | re.DOTALL,
)


def readme_blocks() -> dict[str, str]:
    """Return the README's marked code blocks by name, dedented."""
    return {
        match["name"]: textwrap.dedent(match["body"]) + "\n"
        for match in _BLOCK.finditer(README.read_text())
    }


def _run(*args: str | Path, cwd: Path, timeout: float = 180) -> str:
    """Run a command; return its output, or fail the test with it on a non-zero exit."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_ENV, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture
def broker(empty_database_url: str) -> Iterator[tuple[str, str]]:
    """Yield (broker URL, queue) for the new project; delete the queue afterwards.

    The suite's broker when it is a service; for the serviceless default (the example
    deployment's ``sqlpoll`` alias, which a new project does not have), kombu's own SQL
    transport on the new project's database, dropped with it.
    """
    queue = f"readme-{uuid.uuid4().hex[:10]}"
    url = settings.CELERY_BROKER_URL
    if url.startswith("sqlpoll+"):
        yield "sqla+postgresql+psycopg://" + empty_database_url.split("://", 1)[1], queue
        return
    yield url, queue
    from kombu import Connection, Exchange, Queue

    with Connection(url) as conn:  # Celery's default queue: exchange and routing key its name
        bound = Queue(queue, Exchange(queue), routing_key=queue)(conn.default_channel)
        bound.declare()
        bound.delete()


def _project(site: Path, blocks: dict[str, str], database_url: str, broker: str, queue: str):
    """Generate ``mysite`` with the app ``reports`` in ``site`` as the README's install says."""
    _run(sys.executable, "-m", "django", "startproject", "mysite", site, cwd=site.parent)
    _run(sys.executable, "manage.py", "startapp", "reports", cwd=site)
    named = {"yourproject": "mysite", "yourapp": "reports"}

    def paste(block: str) -> str:
        for placeholder, name in named.items():
            block = block.replace(placeholder, name)
        return block

    (site / "mysite" / "celery.py").write_text(paste(blocks["celery-app"]))
    init = site / "mysite" / "__init__.py"
    init.write_text(init.read_text() + paste(blocks["celery-app-import"]))
    (site / "reports" / "tasks.py").write_text(paste(blocks["task"]))
    settings_py = site / "mysite" / "settings.py"
    settings_py.write_text(
        settings_py.read_text()
        + textwrap.dedent(f"""
            import dj_database_url

            INSTALLED_APPS += ["django_celery_beat", "scheduling", "reports"]
            USE_TZ = True
            DATABASES = {{"default": dj_database_url.parse({database_url!r})}}
            CELERY_BROKER_URL = {broker!r}
            CELERY_TASK_DEFAULT_QUEUE = {queue!r}  # this test's own queue
            CELERY_BEAT_SCHEDULER = "scheduling.schedulers:LedgerScheduler"
            CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]

        """)
        + paste(blocks["logging"])
    )


def _ledger_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM scheduling_run"
            " WHERE periodic_task_name = %s AND dispatched_at IS NOT NULL",
            [TASK_NAME],
        ).fetchone()
    return row[0] if row else 0


def test_the_readme_logging_snippet_prints_each_dispatch_once(
    tmp_path, empty_database_url, broker
):
    blocks = readme_blocks()
    assert {"logging", "celery-app", "celery-app-import", "task"} <= set(blocks), blocks.keys()
    site = tmp_path / "site"
    site.mkdir()
    _project(site, blocks, empty_database_url, *broker)
    python = sys.executable
    assert "Applying scheduling.0001_initial... OK" in _run(
        python, "manage.py", "migrate", "--no-input", cwd=site
    )
    _run(python, "manage.py", "shell", "-c", textwrap.dedent(f"""
        from django_celery_beat.models import IntervalSchedule, PeriodicTask
        every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(
            name={TASK_NAME!r}, task="reports.tasks.send_digest", interval=every
        )
    """), cwd=site)

    output = tmp_path / "beat.log"
    with open(output, "wb") as handle:
        beat = subprocess.Popen(
            [Path(python).parent / "celery", "-A", "mysite", "beat", "-l", "info",
             "-S", "scheduling.schedulers:LedgerScheduler"],
            cwd=site, env=_ENV, stdin=subprocess.DEVNULL, stdout=handle,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + DEADLINE
        while (
            beat.poll() is None
            and time.monotonic() < deadline
            and _ledger_count(empty_database_url) < RUNS
        ):
            time.sleep(0.2)
        assert beat.poll() is None, f"beat exited {beat.returncode}:\n{output.read_text()}"
    finally:
        if beat.poll() is None:
            os.killpg(beat.pid, signal.SIGTERM)
            try:
                beat.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(beat.pid, signal.SIGKILL)
                beat.wait(timeout=10)

    ledger = json.loads(_run(python, "manage.py", "shell", "-c", textwrap.dedent(f"""
        import json
        from scheduling.models import Run
        print(json.dumps(list(Run.objects.filter(
            periodic_task_name={TASK_NAME!r}, dispatched_at__isnull=False
        ).values_list("task_id", flat=True))))
    """), cwd=site).strip().splitlines()[-1])
    log = output.read_text(errors="replace")
    lines = Counter(
        match[1] for match in re.finditer(
            rf"dispatched {re.escape(TASK_NAME)} \(task id ([0-9a-f-]+)\), lateness", log
        )
    )
    assert len(ledger) >= RUNS, f"{len(ledger)} runs dispatched within {DEADLINE} s:\n{log}"
    assert {task_id: n for task_id, n in lines.items() if n != 1} == {}, log
    assert sorted(lines) == sorted(ledger), log
