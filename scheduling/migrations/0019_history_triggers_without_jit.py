"""The edit-history and change-log triggers run without JIT, and the history finds a change's
tasks one kind of row at a time.

JIT: a task's edit in the admin took 460 to 710 ms at 1,000,000 periodic tasks (issue 17's
``million`` scenario, the save alone), 9 ms at 10,000. Nearly all of it was PostgreSQL compiling
``scheduling_write_history``'s statement with LLVM: a SQL function's statement is planned without
its arguments' values, estimated at up to a million rows per affected task, and its estimated
cost passed ``jit_above_cost``, for a statement that writes one row. The same UPDATE with ``jit =
off``: 2 ms. The trigger functions, which run in the editing session (the admin's, or any
client's), now carry ``SET jit = off`` themselves: their statements touch the rows of one
statement, where compiling never pays.

Kinds: the function found the tasks a change affects with one join of the periodic task table on
``(kind = 'interval' AND t.interval_id = c.object_id) OR (kind = 'crontab' AND ...) OR ...``,
which the planner cannot split by ``kind``: it read all five indexes for every change, a task's
own edit included (at 10,000 crontab tasks a task's edit read the 168 tasks whose crontab id
equalled its id, and dropped them). Each kind is now a branch of its own, gated by ``kind =
'...'``, which PostgreSQL evaluates once per call (a one-time filter). What the functions write is
unchanged.

Reverse: the function of 0016, and JIT as the server configures it.
"""

from django.db import migrations

#: scheduling_write_history (migration 0016) around its ``affected`` CTE, and its options.
_WRITE_HISTORY = """
CREATE OR REPLACE FUNCTION scheduling_write_history(kind text, operation text, changes jsonb)
RETURNS void LANGUAGE sql{options} AS $$
    WITH change AS (
        SELECT NULLIF(c->0, 'null') AS old, NULLIF(c->1, 'null') AS new,
               COALESCE(COALESCE(NULLIF(c->1, 'null'), c->0)->>'id',
                        COALESCE(NULLIF(c->1, 'null'), c->0)->>'periodic_task_id')::integer
                   AS object_id
        FROM jsonb_array_elements(changes) AS c
    ),
{affected}    bumped AS (
        -- In task id order, so two statements bumping the same tasks cannot deadlock.
        INSERT INTO scheduling_taskversion (periodic_task_id, version)
        SELECT task_id, 1 FROM affected ORDER BY task_id
        ON CONFLICT (periodic_task_id)
            DO UPDATE SET version = scheduling_taskversion.version + 1
        RETURNING periodic_task_id, version
    )
    INSERT INTO scheduling_taskhistory
        (periodic_task_id, periodic_task_name, version, kind, object_id, operation,
         before, after, changed_at, actor, role)
    SELECT a.task_id, a.task_name, b.version, kind, a.object_id, operation,
           CASE WHEN a.old IS NULL OR a.new IS NULL THEN a.old ELSE
               (SELECT jsonb_object_agg(key, value) FROM jsonb_each(a.old)
                WHERE a.new->key IS DISTINCT FROM value) END,
           CASE WHEN a.old IS NULL OR a.new IS NULL THEN a.new ELSE
               (SELECT jsonb_object_agg(key, value) FROM jsonb_each(a.new)
                WHERE a.old->key IS DISTINCT FROM value) END,
           clock_timestamp(), COALESCE(current_setting('scheduling.actor', true), ''),
           current_user
    FROM affected AS a JOIN bumped AS b ON b.periodic_task_id = a.task_id;
$$;
"""

#: Each kind of row that changed, its own branch, gated by ``kind`` (a one-time filter).
_AFFECTED_BY_KIND = """    affected AS (
        SELECT c.object_id AS task_id, COALESCE(c.new, c.old)->>'name' AS task_name, c.*
        FROM change AS c WHERE kind = 'task'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t ON t.interval_id = c.object_id
        WHERE kind = 'interval'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t ON t.crontab_id = c.object_id
        WHERE kind = 'crontab'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t ON t.solar_id = c.object_id
        WHERE kind = 'solar'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t ON t.clocked_id = c.object_id
        WHERE kind = 'clocked'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t ON t.id = c.object_id
        WHERE kind = 'policy'
    ),
"""

#: 0016's: one join on an OR of every kind.
_AFFECTED_ANY_KIND = """    affected AS (
        SELECT c.object_id AS task_id, COALESCE(c.new, c.old)->>'name' AS task_name, c.*
        FROM change AS c WHERE kind = 'task'
        UNION ALL
        SELECT t.id, t.name, c.*
        FROM change AS c JOIN django_celery_beat_periodictask AS t
            ON (kind = 'interval' AND t.interval_id = c.object_id)
            OR (kind = 'crontab' AND t.crontab_id = c.object_id)
            OR (kind = 'solar' AND t.solar_id = c.object_id)
            OR (kind = 'clocked' AND t.clocked_id = c.object_id)
            OR (kind = 'policy' AND t.id = c.object_id)
    ),
"""

_FUNCTION = _WRITE_HISTORY.format(options=" SET jit = off", affected=_AFFECTED_BY_KIND)

#: Trigger functions that run in the editing session, beside scheduling_write_history.
_TRIGGER_FUNCTIONS = (
    "scheduling_record_history()", "scheduling_note_task_change()",
    "scheduling_note_schedule_change()", "scheduling_note_task_insert()",
)

_PREVIOUS = _WRITE_HISTORY.format(options="", affected=_AFFECTED_ANY_KIND)


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0018_transition_tables_planned_per_statement"),
    ]

    operations = [
        migrations.RunSQL(_FUNCTION, reverse_sql=_PREVIOUS),
        migrations.RunSQL(
            "".join(f"ALTER FUNCTION {name} SET jit = off;\n" for name in _TRIGGER_FUNCTIONS),
            reverse_sql="".join(
                f"ALTER FUNCTION {name} RESET jit;\n" for name in _TRIGGER_FUNCTIONS
            ),
        ),
    ]
