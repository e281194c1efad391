"""A database migrated from zero holds exactly the models' schema and ``scheduling/sql/schema.sql``.

Each migration runs the SQL frozen beside it (``scheduling/migrations/sql/``), never schema.sql,
so schema.sql changed without a migration leaves a migrated database behind it, and this module
fails. The test database, which pytest-django built by running every migration from zero, is
compared twice (``tests/schema_catalog.py``: functions with their arguments, options and body
text, triggers, indexes, constraints, columns):

- with itself once every block of today's schema.sql has run on it (in a transaction rolled
  back): the blocks are CREATE OR REPLACE, so they change nothing exactly when the migrations
  reach the file; a function body edited in the file, a trigger or function added, the foreign
  key's action changed, each shows up as a diff of the object's definition;
- with a database built without migrations, from what the code says today (as procrastinate's
  migration test compares a database built from its ``schema.sql`` with one built by its
  migrations): the tables of django-celery-beat's and this app's models by Django's schema
  editor, then every block of schema.sql. This also catches an index or constraint that the
  migrations' state and the models build differently, and a function or trigger the migrations
  create that the file no longer has.

That a database migrated by the 22 migrations 0001 replaced upgrades to the same schema is
``tests/acceptance/test_migrations.py``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from io import StringIO

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql

from scheduling.checks import check_squashed_migrations
from scheduling.sql import SCHEMA_FILE, schema_blocks
from tests.conftest import connect_raw
from tests.schema_catalog import catalog, differences, report

pytestmark = pytest.mark.django_db


def schema_sql() -> list[str]:
    """Today's schema.sql, every block in the file's order, its placeholders filled, as
    statements to execute."""
    return connection.ops.prepare_sql_script("\n\n".join(schema_blocks().values()))


@pytest.fixture
def built_from_the_code() -> Iterator[dict[str, dict[str, str]]]:
    """The catalog of a new database holding the models' tables and then schema.sql."""
    name = f"schema_{uuid.uuid4().hex[:10]}"
    with connect_raw() as admin:
        admin.autocommit = True
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    default = connections["default"]
    wrapper = type(default)({**default.settings_dict, "NAME": name}, alias="built")
    try:
        with wrapper.schema_editor(atomic=False) as editor:
            for label in ("django_celery_beat", "scheduling"):
                for model in apps.get_app_config(label).get_models():
                    if model._meta.managed and not model._meta.proxy:
                        editor.create_model(model)
        with wrapper.cursor() as cursor:  # the foreign keys exist now, as in migration 0001
            for statement in schema_sql():
                cursor.execute(statement)
        with psycopg.connect(**{**_params(), "dbname": name}) as conn:
            yield catalog(conn)
    finally:
        wrapper.close()
        with connect_raw() as admin:
            admin.autocommit = True
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _params() -> dict[str, object]:
    params = connection.get_connection_params()
    return {k: v for k, v in params.items() if k not in ("cursor_factory", "context")}


def test_the_migrated_database_holds_exactly_the_models_and_schema_sql(built_from_the_code):
    with connect_raw() as conn:
        migrated = catalog(conn)
    text = SCHEMA_FILE.read_text()
    named = {
        "functions": set(re.findall(r"^CREATE OR REPLACE FUNCTION (\w+)\(", text, re.MULTILINE)),
        "triggers": set(re.findall(r"^CREATE OR REPLACE TRIGGER (\w+)", text, re.MULTILINE)),
    }
    assert {name.partition("(")[0] for name in migrated["functions"]} == named["functions"]
    assert {name.partition(".")[2] for name in migrated["triggers"]} == named["triggers"]
    assert (len(named["functions"]), len(named["triggers"])) == (11, 20)
    found = differences(migrated, built_from_the_code)
    assert found == {}, report(found, "migrated", "built from the models and schema.sql")
    constraint = "scheduling_run.scheduling_run_periodic_task_id_9d64afac_fk_django_ce"
    assert migrated["constraints"][constraint] == (
        "f FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask(id)"
        " ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED"
    )


def test_schema_sql_changes_nothing_in_a_database_migrated_from_zero():
    """An edit of schema.sql without a migration carrying it fails here, with its diff."""
    with connect_raw() as conn:
        migrated = catalog(conn)
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL lock_timeout = '10s'")
            for statement in schema_sql():
                conn.execute(statement)
            rerun = catalog(conn)
        assert catalog(conn) == migrated  # rolled back
    assert (len(migrated["functions"]), len(migrated["triggers"])) == (11, 20)
    found = differences(migrated, rerun)
    assert found == {}, (
        "schema.sql differs from what the migrations made; add a migration that carries the "
        "changed blocks (docs/development.md, Changing the schema):\n"
        + report(found, "migrated", "then schema.sql run")
    )


def test_the_migrations_hold_the_models_state():
    """``manage.py makemigrations --check --dry-run scheduling``: the models and the migrations
    say the same (a model changed without a migration fails here)."""
    out = StringIO()
    call_command("makemigrations", "scheduling", "--check", "--dry-run", stdout=out)
    assert out.getvalue() == "No changes detected in app 'scheduling'\n"


@pytest.mark.parametrize(
    ("kept", "count", "last"),
    [("0010_run_without_task_id_index", 9, "0010_run_without_task_id_index"),
     ("0001_initial", 1, "0001_initial")],
)
def test_a_database_migrated_part_of_the_old_way_is_an_error(kept, count, last):
    """Django would neither run the squashed 0001 there nor count it applied (scheduling.E006)."""
    assert check_squashed_migrations(databases=["default"]) == []
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'scheduling' AND name > %s", [kept]
        )
    errors = check_squashed_migrations(databases=["default"])
    assert [(e.id, e.msg) for e in errors] == [(
        "scheduling.E006",
        f"Database alias 'default' applied {count} of the 22 migrations of scheduling that "
        f"0001_initial squashes (the last: {last}), so Django would neither run 0001_initial "
        f"nor count it applied.",
    )]
    assert check_squashed_migrations(databases=None) == []
