"""The triggers' joins of their transition tables are planned for each statement (``EXECUTE``).

PL/pgSQL prepares a static statement once per session and keeps that plan. A trigger's old and
new transition tables have a different size in each statement, so the plan made for the
session's first statement (an admin edit of one row: a nested loop) was reused for every later
one: disabling 3,000 tasks in one UPDATE, after one edit in the same session, took 197 s in the
edit-history trigger instead of 1 s (the join was on ``to_jsonb(o) -> key``, computed for every
pair of rows), holding those tasks' row locks all the while. ``EXECUTE`` plans the statement
anew each time, with the tables' real sizes (a hash join), and the history trigger then joins
on the key column itself; the change log's test for moving the marker is an aggregate, not
EXISTS (below). Planning costs about 0.1 ms a statement, which a claim's bookkeeping update of a
few tasks pays on the hot path (0.69 ms against 0.37-0.45 ms per 3-row update): a statement of
at most 8 rows keeps the session's static plan (64 pairs at most). What the triggers write is
unchanged.

Reverse: nothing to undo (the earlier definitions give the same rows); 0016 and 0005 drop these
functions when reversed.
"""

from django.db import migrations

_FUNCTIONS = """
CREATE OR REPLACE FUNCTION scheduling_note_schedule_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed bigint;
BEGIN
    IF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN  -- an edit: the session's plan
        INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
        SELECT TG_ARGV[0], n.id, clock_timestamp()
        FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id
        WHERE n IS DISTINCT FROM o;
        GET DIAGNOSTICS changed = ROW_COUNT;
    ELSE
        EXECUTE $q$
            INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
            SELECT $1, n.id, clock_timestamp()
            FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id
            WHERE n IS DISTINCT FROM o
        $q$ USING TG_ARGV[0];
        GET DIAGNOSTICS changed = ROW_COUNT;
    END IF;
    IF changed > 0 THEN
        PERFORM scheduling_touch_marker();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION scheduling_note_task_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved boolean;
BEGIN
    IF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN  -- a claim's or an edit's few rows
        INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
        SELECT 'task', n.id, clock_timestamp()
        FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id
        WHERE (n.interval_id, n.crontab_id, n.solar_id, n.clocked_id, n.start_time, n.expires,
               n.one_off, n.enabled, n.date_changed)
              IS DISTINCT FROM
              (o.interval_id, o.crontab_id, o.solar_id, o.clocked_id, o.start_time, o.expires,
               o.one_off, o.enabled, o.date_changed);
        SELECT COALESCE(bool_or(
            (n.interval_id, n.crontab_id, n.solar_id, n.clocked_id, n.start_time, n.expires,
             n.one_off, n.date_changed)
            IS DISTINCT FROM
            (o.interval_id, o.crontab_id, o.solar_id, o.clocked_id, o.start_time, o.expires,
             o.one_off, o.date_changed)
            OR (n.enabled AND NOT o.enabled)
        ), false) INTO moved
        FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id;
        IF moved THEN
            PERFORM scheduling_touch_marker();
        END IF;
        RETURN NULL;
    END IF;
    EXECUTE $q$
        INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
        SELECT 'task', n.id, clock_timestamp()
        FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id
        WHERE (n.interval_id, n.crontab_id, n.solar_id, n.clocked_id, n.start_time, n.expires,
               n.one_off, n.enabled, n.date_changed)
              IS DISTINCT FROM
              (o.interval_id, o.crontab_id, o.solar_id, o.clocked_id, o.start_time, o.expires,
               o.one_off, o.enabled, o.date_changed)
    $q$;
    -- Disabling alone does not move the marker: the claim cancels a disabled task's due run
    -- anyway, and the claim transaction disables finished tasks itself; locking the marker row
    -- there could deadlock with an admin save (django-celery-beat locks the marker first).
    -- An aggregate, not EXISTS: under EXISTS the planner counts on stopping at the first row
    -- and picks a nested loop, which compares every pair of rows when none qualifies (9 million
    -- pairs, 1.7 s, for 3,000 tasks disabled); the aggregate reads each table once (a hash join).
    EXECUTE $q$
        SELECT COALESCE(bool_or(
            (n.interval_id, n.crontab_id, n.solar_id, n.clocked_id, n.start_time, n.expires,
             n.one_off, n.date_changed)
            IS DISTINCT FROM
            (o.interval_id, o.crontab_id, o.solar_id, o.clocked_id, o.start_time, o.expires,
             o.one_off, o.date_changed)
            OR (n.enabled AND NOT o.enabled)
        ), false)
        FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.id = n.id
    $q$ INTO moved;
    IF moved THEN
        PERFORM scheduling_touch_marker();
    END IF;
    RETURN NULL;
END
$$;

-- TG_ARGV: the kind of row ('task', 'crontab', ...) and its key column ('id', 'periodic_task_id').
CREATE OR REPLACE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    changes jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT jsonb_agg(jsonb_build_array(NULL, to_jsonb(n) - '{last_run_at,total_run_count}'::text[])) INTO changes
        FROM scheduling_new_rows AS n;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(o) - '{last_run_at,total_run_count}'::text[], NULL)) INTO changes
        FROM scheduling_old_rows AS o;
    ELSIF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN  -- an edit: the session's plan
        SELECT jsonb_agg(jsonb_build_array(c.old, c.new)) INTO changes
        FROM (
            SELECT to_jsonb(o) - '{last_run_at,total_run_count}'::text[] AS old,
                   to_jsonb(n) - '{last_run_at,total_run_count}'::text[] AS new
            FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o
                ON to_jsonb(o)->key = to_jsonb(n)->key
        ) AS c
        WHERE c.old IS DISTINCT FROM c.new;
    ELSE
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
        PERFORM scheduling_write_history(
            kind, CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                  ELSE 'changed' END, changes);
    END IF;
    IF kind = 'task' AND TG_OP = 'DELETE' THEN
        DELETE FROM scheduling_taskversion
        WHERE periodic_task_id IN (SELECT o.id FROM scheduling_old_rows AS o);
    END IF;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("scheduling", "0017_date_changed_database_clock"),
    ]

    operations = [migrations.RunSQL(_FUNCTIONS, reverse_sql=migrations.RunSQL.noop)]
