-- Migration 0004_guard_execution_functions: the block guard_execution of scheduling/sql/schema.sql
-- as it stood when the migration was made.
-- Frozen history: never edit this file. A change of the schema is a new migration with a file of
-- its own (docs/development.md, Changing the schema).

CREATE OR REPLACE FUNCTION scheduling_start_execution(
    attempt_task_id text, attempt_retries integer, worker_name text,
    OUT mine boolean, OUT run_id bigint
) LANGUAGE plpgsql AS $$
BEGIN
    mine := pg_try_advisory_lock(scheduling_execution_lock_key(attempt_task_id, attempt_retries));
    IF mine THEN
        UPDATE scheduling_run AS r
        SET status = 'running', started_at = clock_timestamp(), worker = worker_name,
            retries = attempt_retries, executions = r.executions + 1
        WHERE r.task_id = attempt_task_id AND r.status = 'dispatched'
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
        reason = CASE WHEN r.reason = 'worker lost' THEN late_reason ELSE r.reason END
    WHERE r.task_id = attempt_task_id AND r.retries = attempt_retries
      AND (r.status IN ('dispatched', 'running', 'retrying')
           OR (r.status = 'failed' AND r.reason = 'worker lost'));
    GET DIAGNOSTICS updated = ROW_COUNT;
    IF held THEN
        unlocked := pg_advisory_unlock(
            scheduling_execution_lock_key(attempt_task_id, attempt_retries));
    END IF;
END
$$;
