"""Incremental reconcile: a created task is named in the change log; indexes for 10M-row ledgers.

The insert trigger now also writes a ScheduleChange row ('unplanned') per created task, so a
reconcile pass plans new tasks from the change log instead of checking every task. The partial
index on pending runs whose task was deleted keeps that check of each pass to the orphans
themselves; the pending-runs index follows the claim's order (scheduled_for, id).
"""

from django.db import migrations, models

_INSERT_LOGGED = """
CREATE OR REPLACE FUNCTION scheduling_note_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
    SELECT 'unplanned', n.id, clock_timestamp() FROM scheduling_new_rows AS n;
    PERFORM scheduling_touch_marker();
    RETURN NULL;
END
$$;
DROP TRIGGER scheduling_task_inserted ON django_celery_beat_periodictask;
CREATE TRIGGER scheduling_task_inserted AFTER INSERT ON django_celery_beat_periodictask
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_task_insert();
"""

_INSERT_UNLOGGED = """
DROP TRIGGER scheduling_task_inserted ON django_celery_beat_periodictask;
CREATE OR REPLACE FUNCTION scheduling_note_task_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM scheduling_touch_marker();
    RETURN NULL;
END
$$;
CREATE TRIGGER scheduling_task_inserted AFTER INSERT ON django_celery_beat_periodictask
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_task_insert();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0008_run_periodic_task_set_null"),
    ]

    operations = [
        migrations.AlterField(
            model_name="schedulechange",
            name="kind",
            field=models.CharField(
                choices=[
                    ("task", "Task"), ("interval", "Interval"), ("crontab", "Crontab"),
                    ("solar", "Solar"), ("clocked", "Clocked"), ("unplanned", "Unplanned"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunSQL(_INSERT_LOGGED, _INSERT_UNLOGGED),
        migrations.RemoveIndex(model_name="run", name="scheduling_run_pending_due"),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["scheduled_for", "id"],
                condition=models.Q(status="pending"),
                name="scheduling_run_pending_due",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["scheduled_for"],
                condition=models.Q(status="pending", periodic_task__isnull=True),
                name="scheduling_run_pending_orphan",
            ),
        ),
    ]
