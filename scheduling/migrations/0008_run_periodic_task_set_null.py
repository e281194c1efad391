"""The ledger's link to its periodic task becomes ON DELETE SET NULL in the database itself.

Django's SET_NULL runs in Python: it collects the runs of a task, nulls their link, then deletes
the task. A claim in flight on one of those runs (another replica's transaction) commits the
task's next run in between; Django never saw that row, so the delete failed once with a
foreign-key error. With the action in PostgreSQL, the DELETE detaches every run, also one
committed a moment before (``tests/integration/test_delete_during_claim.py``).

Django 5.2 has no ``db_on_delete``, so this is SQL. The constraint keeps the name Django gave it
in 0001 (a digest of the table and column names) and its deferral. An AlterField of
``Run.periodic_task`` that recreates the constraint would lose the action: repeat this after one.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0007_replica_and_health"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE scheduling_run"
            " DROP CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce,"
            " ADD CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce"
            " FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask (id)"
            " ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED",
            reverse_sql="ALTER TABLE scheduling_run"
            " DROP CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce,"
            " ADD CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce"
            " FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask (id)"
            " DEFERRABLE INITIALLY DEFERRED",
        ),
    ]
