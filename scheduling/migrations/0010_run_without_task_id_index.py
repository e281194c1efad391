"""Drop the plain index on ``scheduling_run.periodic_task_id``.

``scheduling_run_recent`` (periodic_task_id, scheduled_for DESC) starts with the same column and
serves every lookup by task (and the ON DELETE SET NULL of 0008), so the plain index only cost a
write at each plan and each dispatch. SQL rather than AlterField: Django's AlterField of this
field drops and recreates the foreign key (losing 0008's ON DELETE SET NULL) and also drops the
index of the ``scheduling_run_one_pending_per_task`` constraint.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("scheduling", "0009_incremental_reconcile"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="periodic_task",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="runs",
                        to="django_celery_beat.periodictask",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS scheduling_run_periodic_task_id_9d64afac",
                    reverse_sql="CREATE INDEX IF NOT EXISTS scheduling_run_periodic_task_id_9d64afac"
                    " ON scheduling_run (periodic_task_id)",
                ),
            ],
        ),
    ]
