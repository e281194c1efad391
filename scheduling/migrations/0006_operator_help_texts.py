# Help texts only (AlterField): the run page says what each field means to an operator.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0005_edit_history_entries'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='buffered_at',
            field=models.DateTimeField(blank=True, help_text='When the run was held back because the task\'s previous run had not finished (overlap policy "buffer one"; UTC). Kept after the run was sent.', null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='definition_version',
            field=models.PositiveIntegerField(blank=True, help_text="The version of the task's settings this run was planned from, as listed in the task's edit history. Empty for runs planned before the history began.", null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='due_at',
            field=models.DateTimeField(help_text="When the run became due (UTC): its slot, plus the task's jitter when it has one. Lateness counts from here."),
        ),
        migrations.AlterField(
            model_name='run',
            name='events',
            field=models.JSONField(blank=True, help_text='What happened to the run after it was sent, in order, each with its time (UTC): sent again, recovered after a lost worker, retried by Celery. Empty when none of these happened.', null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='executions',
            field=models.PositiveIntegerField(default=0, help_text="How many times the task's code ran for this run, retries and re-runs included."),
        ),
        migrations.AlterField(
            model_name='run',
            name='overdue_at',
            field=models.DateTimeField(blank=True, help_text="When the run was found not succeeded past its task's success deadline (UTC).", null=True),
        ),
        migrations.AlterField(
            model_name='run',
            name='reason',
            field=models.TextField(blank=True, help_text='Why the run was missed, skipped or cancelled.'),
        ),
        migrations.AlterField(
            model_name='run',
            name='republished',
            field=models.PositiveIntegerField(default=0, help_text='How many times the run was sent to the workers again, as the same run: no worker had started it within the delivery deadline, or its worker was lost and the task is set to recover.'),
        ),
        migrations.AlterField(
            model_name='run',
            name='retries',
            field=models.PositiveIntegerField(default=0, help_text='How many times Celery retried the task (0: no retry).'),
        ),
        migrations.AlterField(
            model_name='run',
            name='scheduled_for',
            field=models.DateTimeField(help_text='The slot of the schedule this run is for (UTC); for a manual run, when it was asked for.'),
        ),
        migrations.AlterField(
            model_name='run',
            name='slots',
            field=models.PositiveIntegerField(default=1, help_text='How many slots of the schedule this run stands for: more than 1 when missed slots were run once together, or slots passed while the task was paused.'),
        ),
        migrations.AlterField(
            model_name='run',
            name='suppressed',
            field=models.PositiveIntegerField(default=0, help_text="Duplicate deliveries of this run, dropped without running the task's code."),
        ),
        migrations.AlterField(
            model_name='run',
            name='task_id',
            field=models.CharField(help_text="The id Celery and the workers' logs know this run by; the same for every delivery of the run.", max_length=255, verbose_name='Celery task id'),
        ),
    ]
