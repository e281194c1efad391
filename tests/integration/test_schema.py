"""A migrated database holds exactly the models' schema and ``scheduling/sql/schema.sql``.

As procrastinate's migration test compares a database built from its ``schema.sql`` with one
built by its migrations, this compares two databases: the test database, which pytest-django
built by running the migrations (0001), and one built without them, from what the code says
today: the tables of django-celery-beat's and this app's models by Django's schema editor, then
every block of schema.sql. Their functions (arguments, options and body text), triggers,
indexes, constraints and columns (``tests/schema_catalog.py``) must be equal, and the functions
and triggers must be the ones the file names. A function or trigger a migration creates outside
the file, an index or constraint that the migration's state and the models build differently, the
ledger's foreign key without its ON DELETE SET NULL: each fails here. That a database migrated by
the 22 migrations 0001 replaced upgrades to the same schema (which also catches a block of
schema.sql edited without a migration that runs it) is ``tests/acceptance/test_migrations.py``.
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
from scheduling.sql import SCHEMA_FILE, schema
from tests.conftest import connect_raw
from tests.schema_catalog import catalog, differences

pytestmark = pytest.mark.django_db


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
            for statement in wrapper.ops.prepare_sql_script(schema()):
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
    assert differences(migrated, built_from_the_code) == {}
    constraint = "scheduling_run.scheduling_run_periodic_task_id_9d64afac_fk_django_ce"
    assert migrated["constraints"][constraint] == (
        "f FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask(id)"
        " ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED"
    )


def test_the_migrations_hold_the_models_state():
    """``makemigrations --check``: the models and migration 0001 say the same."""
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
