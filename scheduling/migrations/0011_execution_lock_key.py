"""The execution-lock key of a run's attempt, as one SQL function both sides call.

The worker guard takes ``pg_try_advisory_lock(scheduling_execution_lock_key(task_id, retries))``
while a delivery executes; the lost-worker sweep looks for running runs whose key is not among
the held advisory locks. Before this function each side wrote the key expression itself (the
guard in Python, the sweep in SQL). The value is the same as before (the text
``scheduling.run:<task id>:<retries>`` hashed by ``hashtextextended``), so workers and replicas
of the previous release agree with this one during an upgrade. IMMUTABLE and plain SQL: the
planner inlines it.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION scheduling_execution_lock_key(task_id text, retries integer)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended('scheduling.run:' || task_id || ':' || retries, 0) $$
"""
DROP = "DROP FUNCTION IF EXISTS scheduling_execution_lock_key(text, integer)"


class Migration(migrations.Migration):

    dependencies = [("scheduling", "0010_run_without_task_id_index")]

    operations = [migrations.RunSQL(CREATE, DROP)]
