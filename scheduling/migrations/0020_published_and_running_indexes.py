"""Indexes of the dispatched runs by their last publish and of the running runs, for the passes.

The redelivery step of every reconcile pass (``ledger.redeliver``, query ``overdue_deliveries``)
and the health probe looked for dispatched runs past their delivery deadline by reading every
dispatched run: few while workers keep up, but every run of a backlog otherwise (workers down, a
queue piling up: the benchmark's lateness scenario, with no worker, reached 120,000, and each
pass read them all, 100 to 900 ms of the server's time). With this index a pass reads only the
runs published longer ago than the shortest delivery deadline in force, oldest first.

The lost-worker sweep of every pass (``running_without_lock``) read the running runs through the
index of unfinished runs, dispatched ones included (200 to 300 ms a pass in that scenario): the
running runs get a partial index of their own, as small as the number of runs executing.

Built concurrently: the ledger may be large, and its writes go on meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models.functions import Coalesce


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("scheduling", "0019_history_triggers_without_jit"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                Coalesce("republished_at", "dispatched_at"), models.F("id"),
                condition=models.Q(status="dispatched"),
                name="scheduling_run_published",
            ),
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(
                fields=["id"], condition=models.Q(status="running"), name="scheduling_run_running"
            ),
        ),
    ]
