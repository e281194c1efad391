"""Pause with a reason: one row per pause of a periodic task (who, when, why, its end, the skipped
run that records the slots passed), at most one open per task (issue 16)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_celery_beat', '0019_alter_periodictasks_options'),
        ('scheduling', '0012_delivery_deadline'),
    ]

    operations = [
        migrations.CreateModel(
            name='Pause',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('paused_at', models.DateTimeField(help_text='When the pause began (database clock, UTC).')),
                ('paused_by', models.CharField(max_length=150)),
                ('why', models.TextField(blank=True, help_text='Why the task was paused.')),
                ('resumed_at', models.DateTimeField(blank=True, null=True)),
                ('resumed_by', models.CharField(blank=True, max_length=150)),
                ('periodic_task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='scheduling_pauses', to='django_celery_beat.periodictask')),
                ('run', models.ForeignKey(blank=True, help_text='The one skipped run that records the slots passed while paused.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='scheduling.run')),
            ],
            options={
                'ordering': ['-paused_at', '-id'],
                'constraints': [models.UniqueConstraint(condition=models.Q(('resumed_at__isnull', True)), fields=('periodic_task',), name='scheduling_pause_one_open_per_task')],
            },
        ),
    ]
