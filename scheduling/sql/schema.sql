-- What the scheduling app's schema holds beyond its models, as it stands today: every SQL function
-- and trigger, and the one constraint Django cannot declare. One block per name
-- (scheduling.sql.parse_schema).
--
-- The tables, columns, indexes and constraints are the models' (scheduling/models/). No migration
-- reads this file: each migration runs its own copy of the SQL it made, frozen in
-- scheduling/migrations/sql/, so a database migrated today gets what one migrated back then got.
-- A change here therefore needs a new migration carrying the changed block's new text, with the
-- old text as its reverse (docs/development.md, Changing the schema). A block starts with a line
-- "-- name --", then comment lines saying what it is for, then its statements. Every statement
-- can run again on a database that has it already (CREATE OR REPLACE). The tables' names are
-- written out. tests/integration/test_schema.py checks that a database migrated from zero holds
-- exactly what this file and the models say (an edit here without a migration fails it);
-- tests/acceptance/test_migrations.py that a database of the 22 migrations 0001 replaced holds
-- the same once migrated by today's code.

-- run_periodic_task_set_null --
-- The ledger's link to its periodic task is ON DELETE SET NULL in the database itself (Django's
-- SET_NULL runs in Python: it collects the runs, nulls their link, then deletes the task, so a
-- claim committing the task's next run in between made the delete fail on the foreign key;
-- tests/integration/test_delete_during_claim.py). Django 5.2 has no db_on_delete. The constraint
-- keeps the name Django gives it (a digest of the table and column names) and its deferral: an
-- AlterField of Run.periodic_task that recreates the constraint would lose the action, so run
-- this block again after one.
ALTER TABLE scheduling_run
    DROP CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce,
    ADD CONSTRAINT scheduling_run_periodic_task_id_9d64afac_fk_django_ce
        FOREIGN KEY (periodic_task_id) REFERENCES django_celery_beat_periodictask (id)
        ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;

-- pause_run_set_null --
-- A pause's link to the skipped run that records its slots (Pause.run) is ON DELETE SET NULL in
-- the database itself, as run_periodic_task_set_null above: the prune deletes runs in SQL,
-- where Django's SET_NULL does not run, and a pause of a pruned run keeps its own audit (who,
-- when, why). The constraint keeps the name and deferral Django gives it.
ALTER TABLE scheduling_pause
    DROP CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id,
    ADD CONSTRAINT scheduling_pause_run_id_db20df94_fk_scheduling_run_id
        FOREIGN KEY (run_id) REFERENCES scheduling_run (id)
        ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;

-- execution_lock_key --
-- The execution-lock key of a run's attempt, one function both sides call: the worker guard
-- takes pg_try_advisory_lock(scheduling_execution_lock_key(task_id, retries)) while a delivery
-- executes (scheduling.guard); the lost-worker sweep looks for running runs whose key is not
-- among the held advisory locks. The text 'scheduling.run:<task id>:<retries>' hashed by
-- hashtextextended. IMMUTABLE and plain SQL: the planner inlines it.
CREATE OR REPLACE FUNCTION scheduling_execution_lock_key(task_id text, retries integer)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT hashtextextended('scheduling.run:' || task_id || ':' || retries, 0) $$;

-- guard_execution --
-- The worker guard's two writes of a first delivery (scheduling.guard._Liveness), one call each
-- on the worker's own session, in autocommit: its start (the execution lock of the attempt,
-- taken without waiting, then, when it was free, the dispatched run started) and its outcome
-- (the run's final status by ledger.record_finished's rule, then, when held, the lock
-- released). PL/pgSQL runs each as two steps of cached plans: a third less server CPU than the
-- same work as one statement with CTEs (0.8 against 1.3 ms a start and outcome), which
-- both sides of the herd share with every claim. The lock is taken before the update; the unlock
-- comes after the run's row is locked by the outcome's update, so a redelivery that takes the
-- freed lock waits for this transaction and finds the run finished. Parameters are positional
-- (queries.sql, start_execution and finish_execution).
CREATE OR REPLACE FUNCTION scheduling_start_execution(
    attempt_task_id text, attempt_retries integer, worker_name text,
    OUT mine boolean, OUT run_id bigint
) LANGUAGE plpgsql AS $$
BEGIN
    mine := pg_try_advisory_lock(scheduling_execution_lock_key(attempt_task_id, attempt_retries));
    IF mine THEN
        UPDATE scheduling_run AS r
        SET status = {status.running}, started_at = clock_timestamp(), worker = worker_name,
            retries = attempt_retries, executions = r.executions + 1
        WHERE r.task_id = attempt_task_id AND r.status = {status.dispatched}
        RETURNING r.id INTO run_id;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION scheduling_finish_execution(
    attempt_task_id text, attempt_retries integer, outcome text, error_text text,
    late_reason text, held boolean, OUT updated bigint, OUT unlocked boolean
) LANGUAGE plpgsql AS $$
BEGIN
    UPDATE scheduling_run AS r
    SET status = outcome, finished_at = clock_timestamp(), error = error_text,
        reason = CASE WHEN r.reason = {reason.worker_lost} THEN late_reason ELSE r.reason END
    WHERE r.task_id = attempt_task_id AND r.retries = attempt_retries
      AND (r.status IN ({unfinished})
           OR (r.status = {status.failed} AND r.reason = {reason.worker_lost}));
    GET DIAGNOSTICS updated = ROW_COUNT;
    IF held THEN
        unlocked := pg_advisory_unlock(
            scheduling_execution_lock_key(attempt_task_id, attempt_retries));
    END IF;
END
$$;

-- run_due_at --
-- Run.due_at, the moment a run is due (its slot plus the task's jitter offset), for every
-- writer: an insert that leaves it empty (raw SQL, Run.objects.create without it) gets
-- scheduled_for; an UPDATE that moves scheduled_for without setting due_at moves it to the new
-- slot (a hand-moved run is due at its slot).
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

-- date_changed_not_ahead --
-- A periodic task's date_changed is never later than the database clock. django-celery-beat
-- sets it (auto_now) from the clock of the process that saves the task; it is an interval's
-- anchor and the moment before which an edited task plans no slot, so a writer an hour ahead
-- would hold the task's first run back an hour. The earlier of the written value and
-- clock_timestamp(), for every writer (save(), QuerySet.update(), raw SQL); an earlier value is
-- kept (docs/semantics.md, Clocks).
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

-- change_log --
-- The change log (scheduling_schedulechange, read by scheduling.ledger.changes) and
-- django-celery-beat's change marker. Statement-level triggers with transition tables: one
-- INSERT per statement whatever its size; the marker moves only when some row really changed,
-- and a created task is named ('unplanned') so a reconcile pass plans it without checking every
-- task. A statement of at most 8 rows (an edit, a claim's bookkeeping) keeps the session's
-- static plan; a larger one is planned for its own transition tables (EXECUTE): a plan made for
-- one row and reused for 3,000 took 197 s. No JIT: these statements touch one statement's rows,
-- where compiling never pays (460 to 710 ms of an admin save at a million tasks).
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

-- history --
-- The edit history (docs/history.md): every change of a periodic task, its schedule row or its
-- policy writes one scheduling_taskhistory row per task and change (the changed columns before
-- and after, the admin user of the transaction-local setting scheduling.actor, the SQL role) and
-- adds 1 to the task's version (scheduling_taskversion), in the statement's transaction. Every
-- to_jsonb of a row drops the task's bookkeeping columns: last_run_at and total_run_count (a
-- claim writes them) and date_changed (every save sets it, django-celery-beat's admin too): a
-- statement that changed only those records nothing. The triggers pass the
-- kind of row and its key column (TG_ARGV). One statement per trigger call, planned for it
-- (EXECUTE: the transition tables' sizes vary from an edit's one row to a bulk UPDATE's
-- thousands), writes every row: each row's JSON is made once and its changed keys found in one
-- pass, and the tasks are bumped in id order, so two statements bumping the same tasks cannot
-- deadlock. Its parameters are the kind and the operation. No JIT (above).
CREATE OR REPLACE FUNCTION scheduling_record_history() RETURNS trigger LANGUAGE plpgsql
SET jit = off AS $$
DECLARE
    kind text := TG_ARGV[0];
    key text := TG_ARGV[1];
    operation text := CASE TG_OP WHEN 'INSERT' THEN 'created' WHEN 'DELETE' THEN 'deleted'
                      ELSE 'changed' END;
    source text;
    tasks text;
BEGIN
    -- The rows, each as (object_id, old, new): old NULL for an INSERT, new NULL for a DELETE.
    source := CASE TG_OP
        WHEN 'INSERT' THEN format(
            'SELECT n.%1$I AS object_id, NULL::jsonb AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count,date_changed}''::text[] AS new'
            ' FROM scheduling_new_rows AS n', key)
        WHEN 'DELETE' THEN format(
            'SELECT o.%1$I AS object_id,'
            ' to_jsonb(o) - ''{last_run_at,total_run_count,date_changed}''::text[] AS old,'
            ' NULL::jsonb AS new FROM scheduling_old_rows AS o', key)
        ELSE format(
            'SELECT n.%1$I AS object_id,'
            ' to_jsonb(o) - ''{last_run_at,total_run_count,date_changed}''::text[] AS old,'
            ' to_jsonb(n) - ''{last_run_at,total_run_count,date_changed}''::text[] AS new'
            ' FROM scheduling_new_rows AS n JOIN scheduling_old_rows AS o ON o.%1$I = n.%1$I',
            key)
        END;
    -- The tasks each changed row belongs to, with their names: a task row is its own; a
    -- schedule row belongs to every task on it; a policy to its task.
    tasks := CASE kind
        WHEN 'task' THEN
            'SELECT c.object_id AS task_id, COALESCE(c.new, c.old)->>''name'' AS task_name, c.*'
            ' FROM change AS c'
        WHEN 'policy' THEN
            'SELECT t.id AS task_id, t.name AS task_name, c.* FROM change AS c'
            ' JOIN django_celery_beat_periodictask AS t ON t.id = c.object_id'
        ELSE format(
            'SELECT t.id AS task_id, t.name AS task_name, c.* FROM change AS c'
            ' JOIN django_celery_beat_periodictask AS t ON t.%I = c.object_id', kind || '_id')
        END;
    -- OFFSET 0 keeps each row's two to_jsonb from being computed again in the lateral pass.
    EXECUTE format($q$
        WITH change AS (
            SELECT d.object_id, d.old, d.new, x.before, x.after
            FROM (%s OFFSET 0) AS d
            CROSS JOIN LATERAL (
                SELECT CASE WHEN d.old IS NULL OR d.new IS NULL THEN d.old
                            ELSE jsonb_object_agg(e.key, e.value) END AS before,
                       CASE WHEN d.old IS NULL OR d.new IS NULL THEN d.new
                            ELSE jsonb_object_agg(e.key, d.new->e.key) END AS after,
                       count(e.key) AS changed
                FROM jsonb_each(CASE WHEN d.new IS NOT NULL THEN d.old END) AS e
                WHERE d.new->e.key IS DISTINCT FROM e.value
            ) AS x
            WHERE d.old IS NULL OR d.new IS NULL OR x.changed > 0
        ),
        affected AS (%s),
        bumped AS (
            INSERT INTO scheduling_taskversion (periodic_task_id, version)
            SELECT task_id, 1 FROM affected ORDER BY task_id
            ON CONFLICT (periodic_task_id)
                DO UPDATE SET version = scheduling_taskversion.version + 1
            RETURNING periodic_task_id, version
        )
        INSERT INTO scheduling_taskhistory
            (periodic_task_id, periodic_task_name, version, kind, object_id, operation,
             before, after, changed_at, actor, role)
        SELECT a.task_id, a.task_name, b.version, $1, a.object_id, $2, a.before, a.after,
               clock_timestamp(), COALESCE(current_setting('scheduling.actor', true), ''),
               current_user
        FROM affected AS a JOIN bumped AS b ON b.periodic_task_id = a.task_id
    $q$, source, tasks) USING kind, operation;
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

-- release_buffered --
-- The overlap policies that buffer (TaskPolicy.BUFFERING; docs/lifecycle.md, "Overlap policies
-- that wait"): when a run of a task leaves the unfinished statuses (dispatched, running, retrying) for
-- any other, by whatever path (the worker's outcome, the lost-worker sweep, the delivery
-- deadline's close, the admin, raw SQL), the task's oldest buffered run (by slot) is pending
-- again, due now (clock_timestamp()), its buffered_at kept: the next claim dispatches it, or
-- buffers it again while another run of the task is unfinished. One run at a time, so
-- buffer_all's runs go in slot order; a released run that ends without a dispatch (the task
-- paused, disabled or deleted meanwhile) releases the next one the same way, so none is left
-- waiting for a run that never comes. Nothing to do (one primary-key probe, one probe of the
-- partial index scheduling_run_waiting) unless the task's policy is one of them or it has a
-- buffered run. A claim may be buffering a run of the task at this instant, having read the
-- finishing run as unfinished: the task's due pending runs are locked first, which waits for that
-- claim's commit (a claim holds its runs for its transaction, milliseconds), so the buffered run
-- it commits is seen by the UPDATE after (a new snapshot) and released; then its next scheduled
-- run (pending, not due yet: the one pending row per task of scheduling_run_one_pending_per_task),
-- so a claim cannot take it should it come due before this transaction commits (SKIP LOCKED:
-- it is claimed after the commit, and reads the run finished); a claim that starts later reads
-- the run finished. BEFORE UPDATE OF periodic_task_id: a buffered run whose task is deleted
-- (ON DELETE SET NULL) is pending again, for the claim or the reconcile pass to cancel.
CREATE OR REPLACE FUNCTION scheduling_release_buffered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_WHEN = 'BEFORE' THEN
        NEW.status := {status.pending};
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM scheduling_taskpolicy
                   WHERE periodic_task_id = NEW.periodic_task_id
                     AND overlap_policy IN ({buffering}))
       AND NOT EXISTS (SELECT 1 FROM scheduling_run
                       WHERE periodic_task_id = NEW.periodic_task_id AND status = {status.buffered}) THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM scheduling_run
    WHERE periodic_task_id = NEW.periodic_task_id AND status = {status.pending}
      AND due_at <= clock_timestamp()
    FOR UPDATE;
    PERFORM 1 FROM scheduling_run
    WHERE periodic_task_id = NEW.periodic_task_id AND trigger = {trigger.schedule}
      AND status = {status.pending} AND buffered_at IS NULL
    FOR UPDATE;
    UPDATE scheduling_run SET status = {status.pending}, due_at = clock_timestamp()
    WHERE id = (SELECT id FROM scheduling_run
                WHERE periodic_task_id = NEW.periodic_task_id AND status = {status.buffered}
                  AND buffered_at IS NOT NULL
                ORDER BY scheduled_for, id LIMIT 1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER scheduling_release_buffered AFTER UPDATE OF status ON scheduling_run
    FOR EACH ROW
    WHEN (((OLD.status IN ({unfinished}) AND NEW.status NOT IN ({unfinished}))
           OR (OLD.status = {status.pending} AND OLD.buffered_at IS NOT NULL
               AND NEW.status IN ({final})))
          AND NEW.periodic_task_id IS NOT NULL)
    EXECUTE FUNCTION scheduling_release_buffered();
CREATE OR REPLACE TRIGGER scheduling_orphan_buffered BEFORE UPDATE OF periodic_task_id
    ON scheduling_run FOR EACH ROW
    WHEN (OLD.status = {status.buffered} AND NEW.periodic_task_id IS NULL)
    EXECUTE FUNCTION scheduling_release_buffered();
