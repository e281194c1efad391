-- Every static SQL statement of the scheduling app, one block per name, loaded by scheduling.sql.
--
-- A block starts with a line "-- name --", then comment lines saying what it is for, then the
-- statement. {run}, {periodic_task}, {change_marker} and {replica} are the tables' names (the
-- models' db_table, filled in when the file is loaded); {fragment_...} is the text of the
-- fragment block of that name. Parameters are psycopg's: %s, or %(name)s.
-- The execution-lock key of a run's attempt is the SQL function scheduling_execution_lock_key
-- (task id, retries), created by migration 0011: the guard and the lost-worker sweep both call it.

-- session_bounds --
-- A scheduler session's server-side bounds (invariant 8: a frozen replica's claim ends within
-- the idle-in-transaction timeout), its TCP keepalives and its application_name.
SELECT set_config('idle_in_transaction_session_timeout', %s, false),
       set_config('statement_timeout', %s, false),
       set_config('tcp_keepalives_idle', %s, false),
       set_config('tcp_keepalives_interval', %s, false),
       set_config('tcp_keepalives_count', %s, false),
       set_config('application_name', %s, false)

-- transaction_bounds --
-- The same bounds for one transaction, on a connection through a pooler (a session setting would
-- stay on the pooler's server session, for its next client, and miss this client's next
-- transaction): the first statement of every transaction of the scheduler there.
SELECT set_config('idle_in_transaction_session_timeout', %s, true),
       set_config('statement_timeout', %s, true),
       set_config('application_name', %s, true)

-- server_pid --
-- The process id of the server session running this query: not the one the connection was given
-- at login when a pooler is in between (scheduling.ledger.pooler).
SELECT pg_backend_pid()

-- prepared_named --
-- Whether this server session holds a prepared statement of that name (the pooler probe).
SELECT EXISTS (SELECT 1 FROM pg_prepared_statements WHERE name = %s)

-- same_server --
-- Which database of which server a connection reaches: the direct connection must reach the
-- database of the default one (the lost-worker sweep reads the execution locks there).
SELECT current_database(), pg_postmaster_start_time()

-- poll --
-- An idle tick's one query: the database clock, the earliest pending run (the first entry of the
-- partial index scheduling_run_pending_due) and django-celery-beat's change marker.
SELECT clock_timestamp(),
       (SELECT scheduled_for FROM {run} WHERE status = 'pending' ORDER BY scheduled_for LIMIT 1),
       (SELECT last_update FROM {change_marker} WHERE ident = 1)

-- database_now --
SELECT clock_timestamp()

-- try_advisory_lock --
-- A session-level advisory lock (the reconcile turn), without waiting.
SELECT pg_try_advisory_lock(%s)

-- advisory_unlock --
SELECT pg_advisory_unlock(%s)

-- advisory_xact_lock --
-- A transaction-level advisory lock (the CELERY_BEAT_SCHEDULE sync), waiting for it.
SELECT pg_advisory_xact_lock(%s)

-- lock_tasks --
-- The periodic tasks a claim updates, locked in id order so two claims cannot deadlock.
SELECT id FROM {periodic_task} WHERE id = ANY(%s) ORDER BY id FOR UPDATE

-- update_tasks --
-- last_run_at, total_run_count and enabled of the tasks a claim dispatched, without moving
-- django-celery-beat's change marker (no replica reloads) or date_changed (the interval anchor).
UPDATE {periodic_task} AS t SET
    last_run_at = COALESCE(v.last_slot, t.last_run_at),
    total_run_count = t.total_run_count + v.runs,
    enabled = t.enabled AND NOT v.disable
FROM unnest(%s::integer[], %s::timestamptz[], %s::integer[], %s::boolean[])
    AS v(id, last_slot, runs, disable)
WHERE t.id = v.id

-- fragment_held_locks --
-- The advisory locks held right now in this database, as the signed 64-bit keys
-- pg_advisory_lock(bigint) was given (pg_locks splits them into classid/objid, objsubid 1).
held AS MATERIALIZED (
    SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))

-- fragment_lock_free --
-- The execution lock of run r's current attempt is not held by any session.
NOT EXISTS (SELECT 1 FROM held WHERE held.key = scheduling_execution_lock_key(r.task_id, r.retries))

-- running_without_lock --
-- Running runs started by the guard whose execution lock is free, with the database clock, the
-- task's worker-loss policy ('' when it has none) and how often the run was re-published.
WITH {fragment_held_locks}
SELECT r.id, r.executions, clock_timestamp(), COALESCE(p.worker_lost_policy, ''), r.republished
FROM {run} r LEFT JOIN {task_policy} p ON p.periodic_task_id = r.periodic_task_id
WHERE r.status = 'running' AND r.executions > 0 AND {fragment_lock_free}

-- close_lost --
-- Close the runs (id, executions) still running with their lock free as failed: worker lost,
-- each with its own error text.
WITH {fragment_held_locks}
UPDATE {run} AS r SET status = 'failed', reason = %s, error = v.error,
    finished_at = clock_timestamp()
FROM unnest(%s::bigint[], %s::integer[], %s::text[]) AS v(id, executions, error)
WHERE r.id = v.id AND r.executions = v.executions AND r.status = 'running' AND {fragment_lock_free}
RETURNING r.id, r.executions, r.task_id, r.periodic_task_name

-- overdue_deliveries --
-- Dispatched runs no worker started within their delivery deadline (the task policy's
-- delivery_timeout_seconds, else %(timeout)s seconds) since their last publish, oldest first,
-- locked for this pass; rows another replica is handling are skipped.
SELECT r.id
FROM {run} r LEFT JOIN {task_policy} p ON p.periodic_task_id = r.periodic_task_id
WHERE r.status = 'dispatched'
  AND COALESCE(r.republished_at, r.dispatched_at) < clock_timestamp()
      - make_interval(secs => COALESCE(p.delivery_timeout_seconds, %(timeout)s)::float8)
ORDER BY COALESCE(r.republished_at, r.dispatched_at), r.id
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED

-- undelivered_count --
-- The health probe: dispatched runs no worker started past their delivery deadline (as in
-- overdue_deliveries) plus %(grace)s seconds (a reconcile interval: a pass should have
-- re-published them).
SELECT count(*)
FROM {run} r LEFT JOIN {task_policy} p ON p.periodic_task_id = r.periodic_task_id
WHERE r.status = 'dispatched'
  AND COALESCE(r.republished_at, r.dispatched_at) < clock_timestamp()
      - make_interval(secs => (COALESCE(p.delivery_timeout_seconds, %(timeout)s) + %(grace)s)::float8)

-- lost_to_recover --
-- The runs (id, executions) to recover, locked, if still running with their lock free: a
-- redelivery that started one meanwhile holds its lock (or bumped executions) and keeps it.
WITH {fragment_held_locks}
SELECT r.id
FROM {run} r JOIN unnest(%s::bigint[], %s::integer[]) AS v(id, executions) ON r.id = v.id
WHERE r.status = 'running' AND r.executions = v.executions AND {fragment_lock_free}
FOR UPDATE OF r SKIP LOCKED

-- try_execution_lock --
-- The guard takes the execution lock of one attempt (task id, retries) on its own session.
SELECT pg_try_advisory_lock(scheduling_execution_lock_key(%s, %s))

-- release_execution_lock --
SELECT pg_advisory_unlock(scheduling_execution_lock_key(%s, %s))

-- guard_keepalives --
SELECT set_config('tcp_keepalives_idle', %s, false),
       set_config('tcp_keepalives_interval', %s, false)

-- fragment_prunable --
-- The runs a prune plan deletes (parameters: final, cutoff, keep, names, slots, ids). A task's
-- kept runs are its `keep` most recent finished runs: those at or after (slot, id) of the
-- keep-th one; a task without such a row (fewer finished runs) keeps them all.
FROM {run} r
LEFT JOIN unnest(%(names)s::text[], %(slots)s::timestamptz[], %(ids)s::bigint[])
    AS k(name, slot, id) ON k.name = r.periodic_task_name
WHERE r.status = ANY(%(final)s) AND COALESCE(r.finished_at, r.scheduled_for) < %(cutoff)s
  AND (%(keep)s = 0 OR (r.scheduled_for, r.id) < (k.slot, k.id))

-- prune_counts --
SELECT r.status, count(*) {fragment_prunable} GROUP BY r.status ORDER BY r.status

-- prune_batch --
-- One batch of a prune, in id order, skipping rows someone else has locked.
DELETE FROM {run} WHERE id IN (
    SELECT r.id {fragment_prunable} AND r.id > %(after)s
    ORDER BY r.id LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED)
RETURNING id, status

-- fragment_replica_upsert --
-- Register or tick replica (id, host, pid), adding the runs claimed since the last write.
INSERT INTO {replica} (id, host, pid, started_at, last_tick_at, runs_claimed, stopped_at)
SELECT %s, %s, %s, now.t, now.t, %s, NULL FROM (SELECT clock_timestamp() AS t) AS now
ON CONFLICT (id) DO UPDATE SET

-- replica_start --
-- A replica registers at start: its row is reset (a restarted replica with the same id).
{fragment_replica_upsert}
    host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
    last_tick_at = EXCLUDED.last_tick_at, runs_claimed = EXCLUDED.runs_claimed, stopped_at = NULL

-- replica_tick --
-- A replica's heartbeat: its last tick and the runs claimed since the previous one.
{fragment_replica_upsert}
    last_tick_at = EXCLUDED.last_tick_at,
    runs_claimed = {replica}.runs_claimed + EXCLUDED.runs_claimed, stopped_at = NULL

-- replica_stop --
UPDATE {replica}
SET last_tick_at = now.t, stopped_at = now.t, runs_claimed = runs_claimed + %s
FROM (SELECT clock_timestamp() AS t) AS now
WHERE id = %s AND pid = %s

-- replica_prune --
-- Rows of replicas that have not ticked for the retention (an interval) are deleted.
DELETE FROM {replica} WHERE last_tick_at < clock_timestamp() - %s

-- set_actor --
-- Who makes the edits of this transaction (an admin user), for the edit history's triggers
-- (migration 0016 reads it with current_setting('scheduling.actor', true)). Transaction-local:
-- it ends with the transaction, so it never reaches a pooler's next client.
SELECT set_config('scheduling.actor', %s, true)
