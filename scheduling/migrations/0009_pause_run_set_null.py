"""A pause's link to its skipped run (``Pause.run``) is ON DELETE SET NULL in the database: the
prune deletes runs in SQL, and a pause's run made it fail on the foreign key
(``sql/0009_pause_run_set_null.sql``: schema.sql's block ``pause_run_set_null`` as it stood when
this migration was made). Reverse: the constraint as Django made it, without the action.
"""

from pathlib import Path

from django.db import migrations

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()

_BEFORE = """
ALTER TABLE scheduling_pause
    DROP CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id,
    ADD CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id
        FOREIGN KEY (run_id) REFERENCES scheduling_run (id) DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0008_overlap_replace_buffer_all"),
    ]

    operations = [
        migrations.RunSQL(_SQL, reverse_sql=_BEFORE),
    ]
