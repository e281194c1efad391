"""An upgrade from the previous release (``tests.acceptance.previous_release``) cannot silently
diverge (invariant 11): its database, written by its own replica and worker, migrates to
today's schema without losing a row, and today's replica and worker then run what it left.

The previous release runs from a git worktree of its commit, with this session's Python: its
``manage.py migrate`` builds the database, its replica and worker (one each) leave runs of every
state an upgrade meets (succeeded; dispatched with no worker left to take them; pending; running
under a worker that stopped mid-body; buffered behind that one, overlap policy buffer one;
skipped for a pause) and edit history entries. Then today's ``migrate`` runs and the database's
catalog (``tests/schema_catalog.py``) and recorded migrations must equal those of a database
migrated fresh by today's code; the runs, edit history entries and pauses keep their ids and
the values of every column they had. Today's replica and worker then execute each run left
pending or dispatched exactly once, counted from the worker's own execution log.

The rolling upgrade is ``test_rolling_upgrade.py``.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.deployment import Deployment, wait_until
from tests.acceptance.previous_release import (
    IMPORTS_LOGGED,
    checkout,
    code_folder,
    manage_at,
    old_processes,
    query,
    scheduling_imported_from,
)
from tests.acceptance.test_migrations import new_database  # noqa: F401  (a fixture)
from tests.schema_catalog import catalog_of, differences, report

# Migrations and the worker guard, not the broker: the first pass of .ci/run covers them.
pytestmark = [pytest.mark.acceptance, pytest.mark.once]

#: The tables whose rows an upgrade must keep.
KEPT = ("scheduling_run", "scheduling_taskhistory", "scheduling_pause")
#: Bounds the children use, so a message a stopped worker held is delivered again within seconds
#: (a re-publish by the ledger, or the broker's redelivery), not after the defaults' minutes. The
#: worker-loss bound keeps its default (60 s): the run the old worker was cut in stays running.
FAST = {
    "SCHEDULING_DELIVERY_TIMEOUT": "5",
    "SCHEDULING_RECONCILE_INTERVAL": "2",
    "CELERY_BROKER_VISIBILITY_TIMEOUT": "8",
}
#: Written by the previous release's code before its replica and worker start.
SEED = """
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from scheduling.models import TaskPolicy
one, _ = IntervalSchedule.objects.get_or_create(every=1, period='seconds')
two, _ = IntervalSchedule.objects.get_or_create(every=2, period='seconds')
for name, every in (('steady-1s', one), ('steady-2s', two), ('to-pause', one)):
    PeriodicTask.objects.create(name=name, task='project.tasks.record', interval=every)
slow = PeriodicTask.objects.create(
    name='slow', task='project.tasks.record', interval=one,
    kwargs='{"label": "slow", "sleep": 30, "log_start": true}')
TaskPolicy.objects.create(periodic_task=slow, overlap_policy='buffer_one')
"""
#: Written by the previous release's code once its worker stopped.
EDIT = """
from django_celery_beat.models import PeriodicTask
from scheduling import ledger
ledger.pause(PeriodicTask.objects.get(name='to-pause'), by='upgrade test', why='before upgrade')
PeriodicTask.objects.filter(name='steady-2s').update(description='edited before the upgrade')
"""


def statuses(url: str) -> Counter[tuple[str, str]]:
    """(task name, status) -> how many runs."""
    return Counter({(name, status): n for name, status, n in query(
        url, "SELECT periodic_task_name, status, count(*) FROM scheduling_run GROUP BY 1, 2"
    )})


def columns_of(url: str) -> dict[str, list[str]]:
    """Each ``KEPT`` table's column names, in order."""
    return {table: [name for (name,) in query(
        url, "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
        " ORDER BY ordinal_position", [table],
    )] for table in KEPT}


def rows(url: str, columns: dict[str, list[str]]) -> dict[str, dict[Any, tuple[Any, ...]]]:
    """Each ``KEPT`` table's rows by id, of ``columns`` (table -> column names)."""
    found = {}
    for table, names in columns.items():
        listed = ", ".join(f'"{name}"' for name in names)
        found[table] = {row[0]: row for row in query(
            url, f'SELECT "id", {listed} FROM {table} ORDER BY "id"'
        )}
    return found


def leave_every_state(url: str, folder: Path, head: Deployment) -> None:
    """Run the previous release's replica and worker until the ledger holds runs of every state
    an upgrade meets (see the module), then stop them."""
    old = old_processes(folder, head)
    manage_at(folder, url, "shell", "--verbosity", "0", "-c", SEED)
    old.start_beat("old-replica")
    old.start_worker("old-worker", concurrency=2)
    try:
        old.wait_ready(timeout=120)
        wait_until(lambda: _busy(statuses(url)), timeout=120, interval=0.2)
        old.stop("old-worker")  # cold: the slow run stays running, its buffered run waits
        manage_at(folder, url, "shell", "--verbosity", "0", "-c", EDIT)
        wait_until(lambda: _left(statuses(url)), timeout=60, interval=0.2)
    finally:
        old.stop()
    assert old.processes["old-replica"].returncode == 0, old.tail("old-replica")
    for name in ("old-replica", "old-worker"):
        assert scheduling_imported_from(old, name) == {folder}


def _busy(counts: Counter[tuple[str, str]]) -> bool:
    return all((counts[("slow", "running")] == 1, counts[("slow", "buffered")] == 1,
                counts[("steady-1s", "succeeded")] >= 2, counts[("to-pause", "succeeded")] >= 1))


def _left(counts: Counter[tuple[str, str]]) -> bool:
    return all((counts[("steady-1s", "dispatched")] >= 2, counts[("steady-2s", "dispatched")] >= 1,
                counts[("to-pause", "skipped")] == 1))


def targets(url: str) -> dict[str, int]:
    """Task id -> run id of the runs pending or dispatched, but the slow task's (one waits
    behind its buffered run)."""
    return {task_id: run_id for run_id, task_id in query(
        url, "SELECT id, task_id FROM scheduling_run WHERE periodic_task_name <> 'slow'"
        " AND status IN ('pending', 'dispatched')",
    )}


def _assert_same_schema(upgraded: str, fresh: str, folder_head: Path) -> None:
    recorded = "SELECT app, name FROM django_migrations ORDER BY app, name"
    assert query(upgraded, recorded) == query(fresh, recorded)
    found = differences(catalog_of(upgraded), catalog_of(fresh))
    assert found == {}, report(found, "upgraded", "fresh")
    manage_at(folder_head, upgraded, "migrate", "--check")  # exits 1 when one is unapplied


@pytest.mark.timeout(600)
def test_a_database_of_the_previous_release_upgrades_and_its_runs_run_once(
    tmp_path, new_database  # noqa: F811
):
    started = time.monotonic()
    upgraded, fresh = new_database(), new_database()
    head = Deployment(tmp_path / "processes", DATABASE_URL=upgraded, **FAST)
    head_folder = Path(__file__).resolve().parents[2]
    with checkout(tmp_path / "previous") as folder:
        assert code_folder(folder, upgraded) == folder / "scheduling"
        assert code_folder(head_folder, upgraded) == head_folder / "scheduling"
        manage_at(folder, upgraded, "migrate", "--no-input", "--verbosity", "0")
        leave_every_state(upgraded, folder, head)
    before_columns = columns_of(upgraded)
    before = rows(upgraded, before_columns)
    left = targets(upgraded)
    counts = statuses(upgraded)
    print("before the upgrade:", {k: len(v) for k, v in before.items()}, dict(counts))
    assert {status for (_, status) in counts} >= {
        "pending", "dispatched", "running", "buffered", "succeeded", "skipped"}
    assert (counts[("slow", "running")], counts[("slow", "buffered")],
            counts[("to-pause", "skipped")]) == (1, 1, 1)
    assert len(before["scheduling_pause"]) == 1
    assert len(before["scheduling_taskhistory"]) >= 6  # 4 created, 1 policy, 1 changed

    manage_at(head_folder, upgraded, "migrate", "--no-input", "--verbosity", "0")
    manage_at(head_folder, fresh, "migrate", "--no-input", "--verbosity", "0")
    _assert_same_schema(upgraded, fresh, head_folder)
    assert rows(upgraded, before_columns) == before

    try:
        head.start_beat("new-replica", **IMPORTS_LOGGED)
        head.start_worker("new-worker", concurrency=2)
        head.wait_ready(timeout=120)
        done = "SELECT count(*) FROM scheduling_run WHERE id = ANY(%s) AND status = 'succeeded'"
        wait_until(lambda: query(upgraded, done, [list(left.values())]) == [(len(left),)],
                   timeout=120, interval=0.2)
    finally:
        head.stop()
    assert scheduling_imported_from(head, "new-replica") == {head_folder}
    executed = Counter(e["task_id"] for e in head.executions())
    assert {task_id: executed[task_id] for task_id in left} == {task_id: 1 for task_id in left}
    assert [task_id for task_id, n in executed.items() if n > 1] == []
    print(f"left pending or dispatched: {len(left)}, executed once each;"
          f" wall time {time.monotonic() - started:.0f} s")
