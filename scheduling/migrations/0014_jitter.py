"""Stable jitter (issue 16): ``TaskPolicy.jitter_seconds`` and ``Run.due_at``, the moment a run
is due (its slot plus the task's jitter offset), which the claim's partial index now orders by.

Existing rows get ``due_at = scheduled_for`` (one UPDATE of the table: on a large ledger, run it
at a quiet moment). A BEFORE trigger fills ``due_at`` for every writer that leaves it empty (an
insert by raw SQL, ``Run.objects.create`` without it), and sets it to the new slot when an
UPDATE moves ``scheduled_for`` without setting ``due_at`` (a hand-moved run is due at its slot).
"""

from django.db import migrations, models

_TRIGGER = """
CREATE FUNCTION scheduling_run_due_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.due_at := COALESCE(NEW.due_at, NEW.scheduled_for);
    ELSIF NEW.scheduled_for IS DISTINCT FROM OLD.scheduled_for
          AND (NEW.due_at IS NULL OR NEW.due_at IS NOT DISTINCT FROM OLD.due_at) THEN
        NEW.due_at := NEW.scheduled_for;
    ELSIF NEW.due_at IS NULL THEN
        NEW.due_at := OLD.due_at;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER scheduling_run_due_at BEFORE INSERT OR UPDATE OF scheduled_for, due_at
ON scheduling_run FOR EACH ROW EXECUTE FUNCTION scheduling_run_due_at();
"""

_DROP_TRIGGER = """
DROP TRIGGER IF EXISTS scheduling_run_due_at ON scheduling_run;
DROP FUNCTION IF EXISTS scheduling_run_due_at();
"""

_HELP = (
    "When the run is due (UTC): scheduled_for plus the task's jitter offset. Lateness is "
    "measured from it. Left empty on insert, the database sets scheduled_for."
)


class Migration(migrations.Migration):

    dependencies = [
        ('django_celery_beat', '0019_alter_periodictasks_options'),
        ('scheduling', '0013_pause'),
    ]

    operations = [
        migrations.AddField(
            model_name='taskpolicy',
            name='jitter_seconds',
            field=models.PositiveIntegerField(default=0, help_text='Each run is due up to this many seconds after its slot, by an offset derived from (task, slot): the same on every replica, never past the next slot. 0: none.'),
        ),
        migrations.AddField(
            model_name='run',
            name='due_at',
            field=models.DateTimeField(null=True, help_text=_HELP),
        ),
        migrations.RunSQL(
            "UPDATE scheduling_run SET due_at = scheduled_for", reverse_sql=migrations.RunSQL.noop
        ),
        migrations.RunSQL(_TRIGGER, reverse_sql=_DROP_TRIGGER),
        migrations.AlterField(
            model_name='run',
            name='due_at',
            field=models.DateTimeField(help_text=_HELP),
        ),
        migrations.RemoveIndex(
            model_name='run',
            name='scheduling_run_pending_due',
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['due_at', 'id'], name='scheduling_run_pending_due'),
        ),
    ]
