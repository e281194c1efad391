from django.db import migrations, models


class Migration(migrations.Migration):
    """The run counts claims owe the periodic tasks, settled by any replica (issue 36, point 5)."""

    dependencies = [
        ('scheduling', '0022_run_events'),
    ]

    operations = [
        migrations.CreateModel(
            name='OwedRunCount',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('periodic_task_id', models.IntegerField(help_text='Id of the periodic task (no constraint).')),
                ('runs', models.PositiveIntegerField(help_text='Scheduled runs the claim dispatched.')),
                ('last_slot', models.DateTimeField(help_text='The newest of those runs\' slots (UTC).')),
            ],
        ),
    ]
