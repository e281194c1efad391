"""A periodic task's ``date_changed`` is never later than the database clock (issue 18, clocks).

django-celery-beat sets ``date_changed`` (``auto_now``) from the clock of the process that saves
the task: the admin's web host, a script, a beat replica syncing ``CELERY_BEAT_SCHEDULE``. It is
an interval's anchor (the first slot is one interval after it) and the moment before which an
edited task plans no slot, so a writer whose clock is an hour ahead would hold the task's first
run back an hour. A BEFORE trigger takes the earlier of the written value and
``clock_timestamp()``, for every writer (``save()``, ``QuerySet.update()``, raw SQL). An earlier
value is kept: a writer behind the database anchors the edit that much earlier, which the
planner's floor (the database clock minus the misfire grace) bounds (docs/semantics.md, Clocks).
"""

from django.db import migrations

_TRIGGER = """
CREATE FUNCTION scheduling_date_changed_not_ahead() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.date_changed := LEAST(NEW.date_changed, clock_timestamp());
    RETURN NEW;
END
$$;

CREATE TRIGGER scheduling_date_changed_not_ahead
BEFORE INSERT OR UPDATE OF date_changed ON django_celery_beat_periodictask
FOR EACH ROW EXECUTE FUNCTION scheduling_date_changed_not_ahead();
"""

_DROP_TRIGGER = """
DROP TRIGGER IF EXISTS scheduling_date_changed_not_ahead ON django_celery_beat_periodictask;
DROP FUNCTION IF EXISTS scheduling_date_changed_not_ahead();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_celery_beat", "0019_alter_periodictasks_options"),
        ("scheduling", "0016_history"),
    ]

    operations = [migrations.RunSQL(_TRIGGER, _DROP_TRIGGER)]
