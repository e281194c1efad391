"""The edit-history trigger hands a large statement's changes to the history writer in parts.

``scheduling_record_history`` gathered every changed row of a statement into one jsonb array
(each row before and after) and called ``scheduling_write_history`` once with it. PostgreSQL
caps a jsonb array at 256 MB (``total size of jsonb array elements exceeds the maximum of
268435455 bytes``), so one UPDATE of about a million periodic tasks failed: issue 17's bench
disabled its million-task pool with one ``QuerySet.update()`` and the statement was refused. The
array now holds at most about ``scheduling.history_part_bytes`` bytes of rows (64 MB unless that
setting is set, for a session or a transaction; the tests set it to one byte): the rows, in key
order, are numbered by the bytes before them, and each part is written by its own call, in key
order, so two statements bump the versions of the same tasks in the same order, as one call did.
A statement of at most 8 changed rows keeps the session's static plan and one call (migration
0018). What is written is unchanged.

Reverse: migration 0018's function (with 0019's ``jit = off``).
"""

from django.db import migrations

_HEAD = """
CREATE OR REPLACE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    operation text := CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                      ELSE 'changed' END;
    changes jsonb;
"""

#: An edit's few rows: one static statement and one call (0018).
_EDIT = """
        SELECT jsonb_agg(jsonb_build_array(c.old, c.new)) INTO changes
        FROM (
            SELECT to_jsonb(o) - '{last_run_at,total_run_count}'::text[] AS old,
                   to_jsonb(n) - '{last_run_at,total_run_count}'::text[] AS new
            FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o
                ON to_jsonb(o)->key = to_jsonb(n)->key
        ) AS c
        WHERE c.old IS DISTINCT FROM c.new;
"""

#: A task's deletion also drops its version row (0016).
_TAIL = """    IF kind = 'task' AND TG_OP = 'DELETE' THEN
        DELETE FROM scheduling_taskversion
        WHERE periodic_task_id IN (SELECT o.id FROM scheduling_old_rows AS o);
    END IF;
    RETURN NULL;
END
$$;
"""

_IN_PARTS = "".join((_HEAD, """    part_bytes bigint := COALESCE(
        NULLIF(current_setting('scheduling.history_part_bytes', true), '')::bigint, 67108864);
    source text;
BEGIN
    -- (Nested: PL/pgSQL evaluates both sides of AND, and an INSERT has no old rows.)
    IF TG_OP = 'UPDATE' THEN
        IF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN
""", _EDIT, """            IF changes IS NOT NULL THEN
                PERFORM scheduling_write_history(kind, operation, changes);
            END IF;
            RETURN NULL;
        END IF;
    END IF;
    source := CASE TG_OP
        WHEN 'INSERT' THEN format(
            'SELECT n.%1$I AS key, NULL::jsonb AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count}''::text[] AS new'
            ' FROM scheduling_new_rows AS n', key)
        WHEN 'DELETE' THEN format(
            'SELECT o.%1$I AS key, to_jsonb(o) - ''{last_run_at,total_run_count}''::text[] AS old,'
            ' NULL::jsonb AS new FROM scheduling_old_rows AS o', key)
        ELSE format(
            'SELECT n.%1$I AS key,'
            ' to_jsonb(o) - ''{last_run_at,total_run_count}''::text[] AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count}''::text[] AS new'
            ' FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.%1$I = n.%1$I',
            key)
        END;
    -- Each row's part: the bytes of the rows before it (in key order), over the part size.
    FOR changes IN EXECUTE format($q$
        SELECT jsonb_agg(jsonb_build_array(c.old, c.new) ORDER BY c.key)
        FROM (
            SELECT d.key, d.old, d.new,
                   COALESCE(sum(COALESCE(pg_column_size(d.old), 0)
                                 + COALESCE(pg_column_size(d.new), 0))
                            OVER (ORDER BY d.key
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                       / $1 AS part
            FROM (%s) AS d
            WHERE d.old IS DISTINCT FROM d.new
        ) AS c
        GROUP BY c.part ORDER BY c.part
    $q$, source) USING part_bytes
    LOOP
        PERFORM scheduling_write_history(kind, operation, changes);
    END LOOP;
""", _TAIL))

#: Migration 0018's function, with 0019's option.
_WHOLE = "".join((_HEAD, """BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT jsonb_agg(jsonb_build_array(NULL, to_jsonb(n) - '{last_run_at,total_run_count}'::text[])) INTO changes
        FROM scheduling_new_rows AS n;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(o) - '{last_run_at,total_run_count}'::text[], NULL)) INTO changes
        FROM scheduling_old_rows AS o;
    ELSIF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN  -- an edit: the session's plan
""", _EDIT, """    ELSE
        EXECUTE format($q$
            SELECT jsonb_agg(jsonb_build_array(c.old, c.new))
            FROM (
                SELECT to_jsonb(o) - '{last_run_at,total_run_count}'::text[] AS old,
                       to_jsonb(n) - '{last_run_at,total_run_count}'::text[] AS new
                FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.%1$I = n.%1$I
            ) AS c
            WHERE c.old IS DISTINCT FROM c.new
        $q$, key) INTO changes;
    END IF;
    IF changes IS NOT NULL THEN
        PERFORM scheduling_write_history(kind, operation, changes);
    END IF;
""", _TAIL))


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0020_published_and_running_indexes"),
    ]

    operations = [migrations.RunSQL(_IN_PARTS, reverse_sql=_WHOLE)]
