"""The worker guard's start and outcome as two PL/pgSQL functions: schema.sql's block
``guard_execution`` as it stood when this migration was made
(``sql/0004_guard_execution_functions.sql``).

The guard wrote a first delivery's start and its outcome as one statement each, with CTEs
(``start_execution`` and ``finish_execution`` of queries.sql). The same work in a function of two
steps costs the server about a third less CPU (0.8 against 1.3 ms a start and outcome, on a
ledger of 300,000 runs), and a guarded worker waits for both before and after every body.
queries.sql now calls the functions. A new block: migration 0001 does not run it.

Reverse: the functions dropped (the queries of an older checkout do not call them).
"""

from pathlib import Path

from django.db import migrations

#: The SQL this migration runs, frozen in its own file (sql/ beside this module).
_SQL = (Path(__file__).parent / "sql" / f"{Path(__file__).stem}.sql").read_text()

_DROP = """
DROP FUNCTION IF EXISTS scheduling_start_execution(text, integer, text);
DROP FUNCTION IF EXISTS scheduling_finish_execution(text, integer, text, text, text, boolean);
"""


class Migration(migrations.Migration):

    dependencies = [("scheduling", "0003_history_in_one_statement")]

    operations = [migrations.RunSQL(_SQL, reverse_sql=_DROP)]
