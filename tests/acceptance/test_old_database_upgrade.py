"""A database an earlier state of main left part of the way through the old migrations upgrades.

Commit ``BEFORE_SQUASH`` (8019954) migrated a database to 0021_history_in_parts with its own
code: a detached worktree of it, its ``manage.py migrate`` run there (PYTHONPATH set to it, the
recorded migration names prove its code ran). The documented path (docs/operating.md,
Upgrading; system check scheduling.E006's hint) then goes: today's ``migrate`` refuses it,
commit ``migration_match.OLD_CHAIN_COMMIT`` (17fdc8d, the last with the old migrations) runs
``migrate scheduling 0023_owed_run_count``, today's ``migrate`` runs the rest. The periodic tasks
and runs are the same rows before and after, and the schema equals a new database's
(``tests/schema_catalog.py``). One worktree per commit for the module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from scheduling.migration_match import OLD_CHAIN_COMMIT, OLD_CHAIN_LAST
from tests.acceptance.previous_release import release_path
from tests.acceptance.private_postgres import manage
from tests.acceptance.test_migrations import AFTER, SHOWN, new_database  # noqa: F401
from tests.schema_catalog import catalog_of, differences

# Migrations and the worker guard, not the broker: the first pass of .ci/run covers them.
pytestmark = [pytest.mark.acceptance, pytest.mark.once]

ROOT = Path(__file__).resolve().parents[2]
#: A state of main whose database stops at 0021_history_in_parts (before 0022 and the squash).
BEFORE_SQUASH = "8019954"
#: The migrations of scheduling that commit recorded.
AT_0021 = [
    "0001_initial", "0002_task_policy", "0003_run_execution_guard", "0004_run_unfinished_index",
    "0005_schedule_change", "0007_replica_and_health", "0008_run_periodic_task_set_null",
    "0009_incremental_reconcile", "0010_run_without_task_id_index", "0011_execution_lock_key",
    "0012_delivery_deadline", "0013_pause", "0014_jitter", "0015_overdue", "0016_history",
    "0017_date_changed_database_clock", "0018_transition_tables_planned_per_statement",
    "0019_history_triggers_without_jit", "0020_published_and_running_indexes",
    "0021_history_in_parts",
]
#: Periodic tasks and finished runs written by the old code (it prints where it was imported).
SEED = (
    "from datetime import timedelta\n"
    "import scheduling\n"
    "from django.utils import timezone\n"
    "from django_celery_beat.models import IntervalSchedule, PeriodicTask\n"
    "from scheduling.models import Run\n"
    "every, _ = IntervalSchedule.objects.get_or_create(every=10, period='seconds')\n"
    "base = timezone.now().replace(microsecond=0) - timedelta(hours=1)\n"
    "for n in range(3):\n"
    "    t = PeriodicTask.objects.create(name=f'kept-{n}', task='project.tasks.record',"
    " interval=every)\n"
    "    for k in range(4):\n"
    "        at = base + timedelta(minutes=k)\n"
    "        Run.objects.create(periodic_task=t, periodic_task_name=t.name, task=t.task,"
    " scheduled_for=at, due_at=at, status='succeeded', task_id=f'old-{n}-{k}')\n"
    "print(scheduling.__file__)\n"
)


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """Detached worktrees of the two old commits, made once for the module."""
    folder = tmp_path_factory.mktemp("old-commits")
    made = {}
    try:
        for commit in (BEFORE_SQUASH, OLD_CHAIN_COMMIT):
            path = folder / commit[:7]
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path),
                            commit], check=True, capture_output=True)
            made[commit] = path
        yield made
    finally:
        for path in made.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           check=False, capture_output=True)


def old_manage(checkout: Path, url: str, *args: str) -> str:
    """``manage.py ARGS`` of an old commit's own code (its folder first on the path)."""
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": release_path(checkout)}
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"manage.py {' '.join(args)} at {checkout.name}:\n{done.stderr}"
    return done.stdout


def recorded(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name FROM django_migrations WHERE app = 'scheduling' "
                            "ORDER BY name").fetchall()
    return [name for (name,) in rows]


def rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    """The periodic tasks' and runs' ids (and what identifies a run), in id order."""
    with psycopg.connect(url) as conn:
        return {
            "tasks": conn.execute("SELECT id, name FROM django_celery_beat_periodictask "
                                  "ORDER BY id").fetchall(),
            "runs": conn.execute("SELECT id, periodic_task_id, scheduled_for, status, task_id "
                                 "FROM scheduling_run ORDER BY id").fetchall(),
        }


def test_a_database_at_0021_upgrades_by_the_documented_path(checkouts, new_database):  # noqa: F811
    old, fresh = new_database(), new_database()
    before_squash, old_chain = checkouts[BEFORE_SQUASH], checkouts[OLD_CHAIN_COMMIT]
    old_manage(before_squash, old, "migrate", "--no-input", "--verbosity", "0")
    assert recorded(old) == AT_0021
    where = old_manage(before_squash, old, "shell", "--verbosity", "0", "-c", SEED)
    assert where.strip() == str(before_squash / "scheduling" / "__init__.py")
    kept = rows(old)
    assert (len(kept["tasks"]), len(kept["runs"])) == (3, 12)

    refused = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"], cwd=ROOT, capture_output=True,
        text=True, env={**os.environ, "DATABASE_URL": old}, timeout=120, check=False,
    )
    assert refused.returncode == 1
    assert "scheduling.E006" in refused.stderr
    assert (f"`python manage.py migrate scheduling {OLD_CHAIN_LAST}`"
            in " ".join(refused.stderr.split()))
    assert recorded(old) == AT_0021  # nothing ran

    old_manage(old_chain, old, "migrate", "scheduling", OLD_CHAIN_LAST, "--no-input")
    assert recorded(old) == sorted([*AT_0021, "0022_run_events", OLD_CHAIN_LAST])
    upgraded = manage(old, "migrate", "--no-input")
    assert upgraded.endswith(
        "Running migrations:\n" + "".join(f"  Applying scheduling.{name}... OK\n" for name in AFTER)
    )
    assert manage(old, "showmigrations", "scheduling") == SHOWN
    manage(old, "migrate", "--check")
    assert rows(old) == kept

    manage(fresh, "migrate", "--no-input", "--verbosity", "0")
    assert differences(catalog_of(old), catalog_of(fresh)) == {}
