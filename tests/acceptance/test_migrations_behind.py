"""A replica and a worker whose code is ahead of the database's migrations say so once and wait.

A database of its own is migrated, a replica dispatches a few runs with no worker up, and the
database is taken back to 0003 (``migrate scheduling 0003_history_in_one_statement``: the
guard's functions of 0004 are gone). A replica and a worker of today's code then start against
it: for ``WINDOW`` seconds each logs exactly one ERROR naming the missing migrations and the
command, no run is dispatched or executed and no message is handed back. Once ``migrate`` runs,
the replica resumes by itself, the worker runs the held messages, and every run executes once
(the worker's own execution records against the ledger).
"""

from __future__ import annotations

import re
import socket
import time
from collections import Counter

import psycopg
import pytest

from tests.acceptance.deployment import ROOT, Deployment, wait_until
from tests.acceptance.private_postgres import manage
from tests.acceptance.test_migrations import new_database  # noqa: F401

# Migrations and the worker guard, not the broker: the first pass of .ci/run covers them.
pytestmark = [pytest.mark.acceptance, pytest.mark.once]

#: Seconds both processes run against the database behind their code.
WINDOW = 10.0
BACK_TO = "0003_history_in_one_statement"
#: The migrations after BACK_TO, as the messages list them: whatever migrations are added later.
MISSING = ", ".join(
    path.stem
    for path in sorted((ROOT / "scheduling" / "migrations").glob("0*.py"))
    if path.stem > BACK_TO
)
TASK = (
    "from django_celery_beat.models import IntervalSchedule, PeriodicTask\n"
    "every, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds')\n"
    "PeriodicTask.objects.create(name='each-second', task='project.tasks.record', interval=every)\n"
)


def statuses(url: str) -> Counter[str]:
    with psycopg.connect(url) as conn:
        return Counter(dict(conn.execute(
            "SELECT status, count(*) FROM scheduling_run GROUP BY status"
        ).fetchall()))


def sent_runs(url: str) -> list[str]:
    """Task ids of the runs a replica published."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT task_id FROM scheduling_run WHERE dispatched_at IS NOT NULL")
        return sorted(task_id for (task_id,) in rows.fetchall())


def errors(log: str) -> list[str]:
    """The ERROR lines of a log (Celery's format or the project's), without their prefix."""
    return re.findall(r"^(?:\[[^]]*: ERROR/\w+\] |\S+ \S+ ERROR \S+: )(.*)$", log, re.MULTILINE)


def test_a_replica_and_a_worker_wait_for_migrate_then_run_each_run_once(
    tmp_path, new_database,  # noqa: F811
):
    url = new_database()
    manage(url, "migrate", "--no-input", "--verbosity", "0")
    manage(url, "shell", "--verbosity", "0", "-c", TASK)
    deployment = Deployment(tmp_path, DATABASE_URL=url)
    try:
        deployment.start_beat("before")
        wait_until(lambda: statuses(url)["dispatched"] >= 3, timeout=60)
        deployment.stop("before")
        manage(url, "migrate", "scheduling", BACK_TO, "--no-input", "--verbosity", "0")
        held = statuses(url)
        assert held["dispatched"] >= 3 and held["running"] == held["succeeded"] == 0

        started = time.monotonic()
        deployment.start_worker("worker", concurrency=1)
        deployment.start_beat("replica")
        deployment.wait_ready("worker", "replica")
        time.sleep(max(0.0, WINDOW - (time.monotonic() - started)))
        replica_log = deployment.log_path("replica").read_text()
        worker_log = deployment.log_path("worker").read_text()
        assert errors(replica_log) == [(
            f"replica replica claims nothing until the migrations match its code: the database "
            f"lacks migration(s) {MISSING} of scheduling; run `python manage.py migrate` with "
            f"this release"
        )]
        node = f"worker@{deployment.queue}.{socket.gethostname()}"
        assert errors(worker_log) == [(
            f"worker {node} holds the scheduled runs it takes until the migrations match its "
            f"code: the database lacks migration(s) {MISSING} of scheduling; run `python "
            f"manage.py migrate` with this release"
        )]
        assert "requeued" not in worker_log
        assert statuses(url) == held
        assert deployment.executions() == []

        manage(url, "migrate", "--no-input", "--verbosity", "0")
        deployment.wait_for_log("replica", "match this code now; resuming", timeout=30)
        wait_until(lambda: len(deployment.executions()) >= held["dispatched"] + 2, timeout=60)
        deployment.stop("replica")
        wait_until(lambda: statuses(url)["dispatched"] + statuses(url)["running"] == 0,
                   timeout=60)
        deployment.stop("worker")
        executed = Counter(e["task_id"] for e in deployment.executions())
        assert sorted(executed) == sent_runs(url)
        assert set(executed.values()) == {1}
        assert errors(deployment.log_path("replica").read_text()) == errors(replica_log)
        assert "requeued" not in deployment.log_path("worker").read_text()
    finally:
        deployment.stop()
        for name in deployment.processes:
            print(f"--- {name} ---\n{deployment.tail(name, 30)}")
