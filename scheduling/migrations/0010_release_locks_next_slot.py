"""The release of a buffered run (schema.sql's block ``release_buffered``) also locks its task's
next scheduled run while it is pending and not due yet: a claim could otherwise take it the
moment it came due, before the transaction that ended the busy run committed, read that run
unfinished and buffer it, and nothing would release it (``sql/0010_release_locks_next_slot.sql``:
the block as it stood when this migration was made). Reverse: the block as 0008 made it.
"""

from pathlib import Path

from django.db import migrations

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()
#: Its reverse: the block as migration 0008 made it.
_BEFORE = (Path(__file__).parent / "sql" / "0008_overlap_replace_buffer_all.sql").read_text()


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0009_pause_run_set_null"),
    ]

    operations = [
        migrations.RunSQL(_SQL, reverse_sql=_BEFORE),
    ]
