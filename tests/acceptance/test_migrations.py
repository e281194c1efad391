"""Migration 0001 upgrades a database of the 22 migrations it replaced, and reverses.

The old chain is read from git (``OLD_CHAIN``, the last commit that had it) into a package of a
temporary folder, which a settings module there names in ``MIGRATION_MODULES``: ``manage.py
migrate`` in a child process builds a new database with it, as a deployment of that commit did
(its migrations import nothing of the app, so today's code runs them). Then ``migrate`` with
today's code must apply nothing, ``showmigrations`` must show 0001 applied, and the database's
functions, triggers, indexes, constraints and columns (``tests/schema_catalog.py``) and its
recorded migrations must equal those of a new database migrated by today's migrations (each
runs its own frozen SQL, so both get the same). That those reach scheduling/sql/schema.sql is
``tests/integration/test_schema.py``. The second test reverses every migration of the app to
nothing and applies them again.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from tests.acceptance import deployment
from tests.acceptance.private_postgres import manage
from tests.schema_catalog import catalog_of, differences

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
#: The last commit with migrations 0001_initial to 0023_owed_run_count.
OLD_CHAIN = "17fdc8db76572b7f15401c98c3001d0f0ef995c0"
#: The migrations after 0001, in order: every one on disk, whatever is added later.
AFTER = tuple(
    path.stem for path in sorted((ROOT / "scheduling" / "migrations").glob("0*.py"))
    if path.stem != "0001_initial"
)
SHOWN = "scheduling\n [X] 0001_initial (21 squashed migrations)\n" + "".join(
    f" [X] {name}\n" for name in AFTER
)
#: A periodic task written before the upgrade, edited after it (the triggers keep working).
SEED = (
    "from django_celery_beat.models import IntervalSchedule, PeriodicTask\n"
    "every, _ = IntervalSchedule.objects.get_or_create(every=10, period='seconds')\n"
    "PeriodicTask.objects.create(name='kept', task='project.tasks.record', interval=every)\n"
)
EDIT = "PeriodicTask.objects.filter(name='kept').update(enabled=False)\n"
HISTORY = (
    "from scheduling.models import TaskHistory\n"
    "print(list(TaskHistory.objects.filter(periodic_task_name='kept')"
    ".order_by('version').values_list('version', 'operation')))\n"
)


@pytest.fixture
def new_database() -> Iterator[Callable[[], str]]:
    """Yield a maker of empty databases on the test's server (URLs); drop them all at the end."""
    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k not in ("cursor_factory", "context")}
    made: list[str] = []
    admin = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)

    def make() -> str:
        name = f"migrations_{uuid.uuid4().hex[:10]}"
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return urlunsplit(urlsplit(deployment.test_database_url())._replace(path=f"/{name}"))

    try:
        yield make
    finally:
        for name in made:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            ))
        admin.close()


def _old_chain_settings(folder: Path) -> dict[str, str]:
    """Write the old chain and a settings module naming it into ``folder``; return the env."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD_CHAIN, "scheduling/migrations"],
        capture_output=True, check=True,
    ).stdout
    package = folder / "scheduling_old_migrations"
    package.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                (package / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    (folder / "old_chain_settings.py").write_text(
        "from project.settings import *  # noqa: F403\n\n"
        "MIGRATION_MODULES = {'scheduling': 'scheduling_old_migrations'}\n"
    )
    return {
        "DJANGO_SETTINGS_MODULE": "old_chain_settings",
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
    }


def _recorded(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'scheduling' ORDER BY name"
        ).fetchall()
    return [name for (name,) in rows]


def test_a_database_of_the_old_chain_upgrades_to_the_schema_of_a_new_one(tmp_path, new_database):
    old, fresh = new_database(), new_database()
    old_env = _old_chain_settings(tmp_path)
    manage(old, "migrate", "--no-input", "--verbosity", "0", **old_env)
    replaced = _recorded(old)
    assert len(replaced) == 22
    assert (replaced[0], replaced[-1]) == ("0001_initial", "0023_owed_run_count")
    manage(old, "shell", "--verbosity", "0", "-c", SEED, **old_env)

    upgraded = manage(old, "migrate", "--no-input")
    # 0001 counted applied (it replaces the chain), only the migrations after it run
    assert upgraded.endswith(
        "Running migrations:\n" + "".join(f"  Applying scheduling.{name}... OK\n" for name in AFTER)
    )
    assert manage(old, "showmigrations", "scheduling") == SHOWN
    manage(old, "migrate", "--check")  # exits 1 when a migration is unapplied
    manage(old, "shell", "--verbosity", "0", "-c", SEED.splitlines()[0] + "\n" + EDIT)
    history = manage(old, "shell", "--verbosity", "0", "-c", HISTORY)
    assert history == "[(1, 'created'), (2, 'changed')]\n"

    manage(fresh, "migrate", "--no-input", "--verbosity", "0")
    assert manage(fresh, "showmigrations", "scheduling") == SHOWN
    assert _recorded(old) == _recorded(fresh) == sorted([*replaced, *AFTER])
    upgraded_schema, fresh_schema = catalog_of(old), catalog_of(fresh)
    assert (len(fresh_schema["functions"]), len(fresh_schema["triggers"])) == (11, 20)
    assert differences(upgraded_schema, fresh_schema) == {}


def test_0001_reverses_to_nothing_and_applies_again(new_database):
    url = new_database()
    manage(url, "migrate", "--no-input", "--verbosity", "0")
    before = catalog_of(url)
    manage(url, "migrate", "scheduling", "zero", "--no-input", "--verbosity", "0")
    assert catalog_of(url) == {kind: {} for kind in before}
    assert _recorded(url) == []
    # A task that exists when the app is installed: version 1, its definition recorded.
    manage(url, "shell", "--verbosity", "0", "-c", SEED)
    manage(url, "migrate", "--no-input", "--verbosity", "0")
    assert catalog_of(url) == before
    assert manage(url, "shell", "--verbosity", "0", "-c", HISTORY) == "[(1, 'recorded')]\n"
