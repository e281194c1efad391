-- Migration 0001_initial: the blocks run_periodic_task_set_null, execution_lock_key, run_due_at,
-- date_changed_not_ahead, change_log and history of scheduling/sql/schema.sql as they stood when
-- the migration was made (history's older writer, replaced by 0003).
-- Frozen history: never edit this file. A change of the schema is a new migration with a file of
-- its own (docs/development.md, Changing the schema).

ALTER TABLE scheduling_run
    DROP CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce,
    ADD CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce
        FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask (id)
        ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;

CREATE OR REPLACE FUNCTION scheduling_execution_lock_key(task_id text, retries integer)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended('scheduling.run:' || task_id || ':' || retries, 0) $$;

CREATE OR REPLACE FUNCTION scheduling_run_due_at() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE TRIGGER scheduling_run_due_at BEFORE INSERT OR UPDATE OF scheduled_for, due_at
ON scheduling_run FOR EACH ROW EXECUTE FUNCTION scheduling_run_due_at();

CREATE OR REPLACE FUNCTION scheduling_date_changed_not_ahead() RETURNS trigger LANGUAGE plpgsql
AS $$
BEGIN
    NEW.date_changed := LEAST(NEW.date_changed, clock_timestamp());
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_date_changed_not_ahead
BEFORE INSERT OR UPDATE OF date_changed ON django_celery_beat_periodictask
FOR EACH ROW EXECUTE FUNCTION scheduling_date_changed_not_ahead();

CREATE OR REPLACE FUNCTION scheduling_touch_marker() RETURNS void LANGUAGE sql AS $$
    INSERT INTO django_celery_beat_periodictasks (ident, last_update)
    VALUES (1, clock_timestamp())
    ON CONFLICT (ident) DO UPDATE SET last_update = EXCLUDED.last_update;
$$;

CREATE OR REPLACE FUNCTION scheduling_note_schedule_change() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
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

CREATE OR REPLACE FUNCTION scheduling_note_task_change() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
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

CREATE OR REPLACE FUNCTION scheduling_note_task_insert() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
BEGIN
    INSERT INTO scheduling_schedulechange (kind, object_id, changed_at)
    SELECT 'unplanned', n.id, clock_timestamp() FROM scheduling_new_rows AS n;
    PERFORM scheduling_touch_marker();
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_task_changed AFTER UPDATE ON django_celery_beat_periodictask
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_task_change();
CREATE OR REPLACE TRIGGER scheduling_task_inserted AFTER INSERT ON django_celery_beat_periodictask
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_task_insert();
CREATE OR REPLACE TRIGGER scheduling_interval_changed
    AFTER UPDATE ON django_celery_beat_intervalschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_schedule_change('interval');
CREATE OR REPLACE TRIGGER scheduling_crontab_changed
    AFTER UPDATE ON django_celery_beat_crontabschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_schedule_change('crontab');
CREATE OR REPLACE TRIGGER scheduling_solar_changed
    AFTER UPDATE ON django_celery_beat_solarschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_schedule_change('solar');
CREATE OR REPLACE TRIGGER scheduling_clocked_changed
    AFTER UPDATE ON django_celery_beat_clockedschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_note_schedule_change('clocked');

CREATE OR REPLACE FUNCTION scheduling_write_history(kind text, operation text, changes jsonb)
RETURNS void LANGUAGE sql SET jit = off AS $$
    WITH change AS (
        SELECT NULLIF(c->0, 'null') AS old, NULLIF(c->1, 'null') AS new,
               COALESCE(COALESCE(NULLIF(c->1, 'null'), c->0)->>'id',
                        COALESCE(NULLIF(c->1, 'null'), c->0)->>'periodic_task_id')::integer
                   AS object_id
        FROM jsonb_array_elements(changes) AS c
    ),
    affected AS (
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
    bumped AS (
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

CREATE OR REPLACE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    operation text := CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                      ELSE 'changed' END;
    changes jsonb;
    part_bytes bigint := COALESCE(
        NULLIF(current_setting('scheduling.history_part_bytes', true), '')::bigint, 67108864);
    source text;
BEGIN
    -- (Nested: PL/pgSQL evaluates both sides of AND, and an INSERT has no old rows.)
    IF TG_OP = 'UPDATE' THEN
        IF (SELECT count(*) FROM scheduling_new_rows) <= 8 THEN

        SELECT jsonb_agg(jsonb_build_array(c.old, c.new)) INTO changes
        FROM (
            SELECT to_jsonb(o) - '{last_run_at,total_run_count}'::text[] AS old,
                   to_jsonb(n) - '{last_run_at,total_run_count}'::text[] AS new
            FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o
                ON to_jsonb(o)->key = to_jsonb(n)->key
        ) AS c
        WHERE c.old IS DISTINCT FROM c.new;
            IF changes IS NOT NULL THEN
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
    IF kind = 'task' AND TG_OP = 'DELETE' THEN
        DELETE FROM scheduling_taskversion
        WHERE periodic_task_id IN (SELECT o.id FROM scheduling_old_rows AS o);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_history_task_insert
    AFTER INSERT ON django_celery_beat_periodictask
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_task_update
    AFTER UPDATE ON django_celery_beat_periodictask
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_task_delete
    AFTER DELETE ON django_celery_beat_periodictask
    REFERENCING OLD TABLE AS scheduling_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('task', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_interval_update
    AFTER UPDATE ON django_celery_beat_intervalschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('interval', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_crontab_update
    AFTER UPDATE ON django_celery_beat_crontabschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('crontab', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_solar_update
    AFTER UPDATE ON django_celery_beat_solarschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('solar', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_clocked_update
    AFTER UPDATE ON django_celery_beat_clockedschedule
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('clocked', 'id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_insert
    AFTER INSERT ON scheduling_taskpolicy
    REFERENCING NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_update
    AFTER UPDATE ON scheduling_taskpolicy
    REFERENCING OLD TABLE AS scheduling_old_rows NEW TABLE AS scheduling_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
CREATE OR REPLACE TRIGGER scheduling_history_policy_delete
    AFTER DELETE ON scheduling_taskpolicy
    REFERENCING OLD TABLE AS scheduling_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION scheduling_record_history('policy', 'periodic_task_id');
