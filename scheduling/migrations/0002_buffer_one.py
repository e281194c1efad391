"""Overlap policy buffer_one: the run status ``buffered``, ``Run.buffered_at``, at most one
buffered run per task, a released buffered run outside the one-pending-per-task constraint, and
the trigger that makes a task's buffered run pending again when its unfinished run ends
(``sql/0002_buffer_one.sql``: schema.sql's block ``release_buffered`` as it stood when this
migration was made). Reverse: the function dropped with its triggers, then the model changes
undone.
"""

from pathlib import Path

from django.db import migrations, models

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()

_DROP = "DROP FUNCTION IF EXISTS scheduling_release_buffered() CASCADE;"


class Migration(migrations.Migration):

    dependencies = [
        ('django_celery_beat', '0019_alter_periodictasks_options'),
        ('scheduling', '0001_initial'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='run',
            name='scheduling_run_one_pending_per_task',
        ),
        migrations.AddField(
            model_name='run',
            name='buffered_at',
            field=models.DateTimeField(blank=True, help_text="When the claim buffered the run behind its task's unfinished run (overlap policy buffer one; database clock); kept once the run is released and dispatched.", null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('dispatched', 'Dispatched'), ('running', 'Running'), ('retrying', 'Retrying'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('missed', 'Missed'), ('skipped', 'Skipped'), ('buffered', 'Buffered'), ('cancelled', 'Cancelled'), ('expired', 'Expired')], default='pending', max_length=16),
        ),
        migrations.AlterField(
            model_name='taskpolicy',
            name='overlap_policy',
            field=models.CharField(choices=[('allow', 'allow: runs may overlap'), ('skip', 'skip: no new run while the previous one is unfinished'), ('buffer_one', 'buffer one: while a run is unfinished, the next waits and runs after it; further slots are skipped')], default='allow', max_length=16),
        ),
        migrations.AlterField(
            model_name='taskpolicy',
            name='overlap_stale_seconds',
            field=models.PositiveIntegerField(blank=True, help_text='An unfinished run older than this no longer blocks (overlap skip, buffer one). Empty: the global setting.', null=True),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.UniqueConstraint(condition=models.Q(('buffered_at__isnull', True), ('status', 'pending'), ('trigger', 'schedule')), fields=('periodic_task',), name='scheduling_run_one_pending_per_task'),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.UniqueConstraint(condition=models.Q(('status', 'buffered')), fields=('periodic_task',), name='scheduling_run_one_buffered_per_task'),
        ),
        migrations.RunSQL(_SQL, reverse_sql=_DROP),
    ]
