"""Overlap policies buffer_all and replace: their choices, ``TaskPolicy.buffer_limit`` and
``replace_started``; many buffered runs per task (the unique constraint of one gives way to the
index ``scheduling_run_waiting`` of a task's waiting runs in slot order); and the trigger that
releases a task's oldest buffered run, one at a time, for the three policies that wait
(``sql/0008_overlap_replace_buffer_all.sql``: schema.sql's block ``release_buffered`` as it
stood when this migration was made). Reverse: the block as 0002 made it, then the model changes
undone (which fails while a task has two buffered runs).
"""

from pathlib import Path

from django.db import migrations, models

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()
#: Its reverse: the block as migration 0002 made it.
_BEFORE = (Path(__file__).parent / "sql" / "0002_buffer_one.sql").read_text()


class Migration(migrations.Migration):

    dependencies = [
        ('django_celery_beat', '0019_alter_periodictasks_options'),
        ('scheduling', '0007_history_pauses_no_bookkeeping'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='run',
            name='scheduling_run_one_buffered_per_task',
        ),
        migrations.AddField(
            model_name='taskpolicy',
            name='buffer_limit',
            field=models.PositiveIntegerField(default=100, help_text='Overlap buffer all: most runs waiting at once. A slot due while this many wait is recorded skipped (buffer full).'),
        ),
        migrations.AddField(
            model_name='taskpolicy',
            name='replace_started',
            field=models.CharField(choices=[('finish', 'finish: the started run finishes, then the new slot runs'), ('terminate', 'terminate: revoke the started run (SIGTERM), then run the new slot')], default='finish', help_text='Overlap replace, when the unfinished run has already started: let it finish (its outcome kept) or revoke it with terminate; the new slot runs once it has ended.', max_length=16),
        ),
        migrations.AlterField(
            model_name='run',
            name='buffered_at',
            field=models.DateTimeField(blank=True, help_text="When the run was held back because the task's previous run had not finished (an overlap policy that waits; UTC). Kept after the run was sent.", null=True),
        ),
        migrations.AlterField(
            model_name='taskpolicy',
            name='overlap_policy',
            field=models.CharField(choices=[('allow', 'allow: runs may overlap'), ('skip', 'skip: no new run while the previous one is unfinished'), ('buffer_one', 'buffer one: while a run is unfinished, the next waits and runs after it; further slots are skipped'), ('buffer_all', 'buffer all: while a run is unfinished, every further slot waits and runs after it, in slot order, one at a time (up to the buffer limit)'), ('replace', "replace: a new slot ends the unfinished run (not started: it never starts; started: as 'replace started' says) and runs instead")], default='allow', max_length=16),
        ),
        migrations.AlterField(
            model_name='taskpolicy',
            name='overlap_stale_seconds',
            field=models.PositiveIntegerField(blank=True, help_text='An unfinished run dispatched longer ago than this no longer holds a new slot back (every overlap policy but allow). Empty: the global setting.', null=True),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('buffered_at__isnull', False), ('status__in', ['buffered', 'pending'])), fields=['periodic_task', 'scheduled_for', 'id'], name='scheduling_run_waiting'),
        ),
        migrations.RunSQL(_SQL, reverse_sql=_BEFORE),
    ]
