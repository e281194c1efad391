# Replica heartbeats (display and health probes only) and the schedule health admin page.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0005_schedule_change"),
    ]

    operations = [
        migrations.CreateModel(
            name="Replica",
            fields=[
                (
                    "id",
                    models.CharField(
                        max_length=255, primary_key=True, serialize=False, verbose_name="replica"
                    ),
                ),
                ("host", models.CharField(max_length=255)),
                ("pid", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField()),
                ("last_tick_at", models.DateTimeField()),
                ("runs_claimed", models.PositiveBigIntegerField(default=0)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"ordering": ["-last_tick_at"]},
        ),
        migrations.CreateModel(
            name="ScheduleHealth",
            fields=[],
            options={
                "verbose_name": "schedule health",
                "verbose_name_plural": "schedule health",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("scheduling.run",),
        ),
    ]
