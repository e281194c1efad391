"""The edit history without bookkeeping saves, and with pauses: schema.sql's block ``history``
as it stood when this migration was made (``sql/0007_history_pauses_no_bookkeeping.sql``), and
the entry kind ``pause`` with its operations ``paused`` and ``resumed``.

A save that changed no field still wrote an entry and a new version: django-celery-beat's
``save()`` (its admin's too) moves ``date_changed``, which the trigger compared with the other
columns. It now drops ``date_changed`` from each row as it drops ``last_run_at`` and
``total_run_count``. A pause or resume is written by ``ledger.pause`` / ``ledger.resume`` with
the version in force, so one version per task holds only for definition changes: the unique
constraint now leaves pause entries out.

Reverse: the block as 0003 made it (``_BEFORE``), and the constraint over every entry again (which
fails while pause entries share a version: delete them first).
"""

from pathlib import Path

from django.db import migrations, models

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()

#: Its reverse: the block as migration 0003 made it (its file also drops a function gone since,
#: IF EXISTS: nothing then).
_BEFORE = (Path(__file__).parent / "sql" / "0003_history_in_one_statement.sql").read_text()


class Migration(migrations.Migration):

    dependencies = [("scheduling", "0006_operator_help_texts")]

    operations = [
        migrations.RunSQL(_SQL, reverse_sql=_BEFORE),
        migrations.RemoveConstraint(
            model_name="taskhistory",
            name="scheduling_history_one_per_version",
        ),
        migrations.AlterField(
            model_name="taskhistory",
            name="kind",
            field=models.CharField(
                choices=[
                    ("task", "Task"), ("interval", "Interval"), ("crontab", "Crontab"),
                    ("solar", "Solar"), ("clocked", "Clocked"), ("policy", "Policy"),
                    ("pause", "Pause"),
                ],
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="taskhistory",
            name="operation",
            field=models.CharField(
                choices=[
                    ("created", "Created"), ("changed", "Changed"), ("deleted", "Deleted"),
                    ("recorded", "Recorded"), ("paused", "Paused"), ("resumed", "Resumed"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="taskhistory",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "pause"), _negated=True),
                fields=("periodic_task_id", "version"),
                name="scheduling_history_one_per_version",
            ),
        ),
    ]
