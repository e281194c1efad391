-- Every static SQL statement of the scheduling app, one block per name, loaded by scheduling.sql.
--
-- A block starts with a line "-- name --", then comment lines saying what it is for, then the
-- statement. {run}, {periodic_task}, {change_marker}, {replica}, {task_policy}, {task_version},
-- {schedule_change}, {pause} and the schedules' {interval_schedule}, {crontab_schedule},
-- {solar_schedule} and {clocked_schedule} are the tables' names (the models' db_table, filled in
-- when the file is loaded); {fragment_...} is the text of the fragment block of that name.
-- Parameters are psycopg's: %s, or %(name)s.
-- The execution-lock key of a run's attempt is the SQL function scheduling_execution_lock_key
-- (task id, retries) of schema.sql: the guard and the lost-worker sweep both call it.

-- session_bounds --
-- A scheduler session's server-side bounds (invariant 8: a frozen replica's claim ends within
-- the idle-in-transaction timeout), its TCP keepalives and user timeout (a replica cut off
-- silently: session.Keepalives) and its application_name. Its one prepared statement with a
-- parameter, the claim (its due floor), is planned once: generic plans only.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('idle_in_transaction_session_timeout', %s, false),
       set_config('statement_timeout', %s, false),
       set_config('tcp_keepalives_idle', %s, false),
       set_config('tcp_keepalives_interval', %s, false),
       set_config('tcp_keepalives_count', %s, false),
       set_config('tcp_user_timeout', %s, false),
       set_config('application_name', %s, false)

-- transaction_bounds --
-- The same bounds for one transaction, on a connection through a pooler (a session setting would
-- stay on the pooler's server session, for its next client, and miss this client's next
-- transaction): the first statement of every transaction of the scheduler there.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('idle_in_transaction_session_timeout', %s, true),
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
-- An idle tick's one query: the database clock, the earliest due moment at or after %s of a
-- pending run (the first such entry of the partial index scheduling_run_pending_due: the scan
-- starts there, ledger.DueFloor) and django-celery-beat's change marker.
SELECT clock_timestamp(),
       (SELECT due_at FROM {run} WHERE status = {status.pending} AND due_at >= %s
        ORDER BY due_at LIMIT 1),
       (SELECT last_update FROM {change_marker} WHERE ident = 1)

-- claim --
-- The claim (invariant 2): the due pending runs, up to %(limit)s, locked FOR UPDATE SKIP LOCKED
-- (the lock lives as long as the transaction; rows another replica holds are skipped, not
-- waited for), in (due_at, id) order: the partial index scheduling_run_pending_due, read from
-- %(floor)s on (the replica's due floor, ledger.DueFloor) up to the statement's database clock
-- (a stable bound: an index condition, invariant 5). With each run, the columns the claim reads
-- (ledger.claim_rows reads a row by column name: the aliases are the attributes of ClaimedRun and ClaimedTask):
-- the run's, the database clock, busy_since (the newest dispatch of an unfinished run of the
-- task, for the overlap policies that hold a run back: the partial index
-- scheduling_run_unfinished), waiting (how many other runs of the task wait: buffered, or
-- released and pending again; for the policies that buffer: the partial index
-- scheduling_run_waiting), pause_id (the
-- task's open pause: the partial unique constraint scheduling_pause_one_open_per_task), then its
-- periodic task, schedule, policy and definition version (NULL when there is none). Statuses
-- are literals, so a generic plan proves the partial indexes' predicates; the floor and the
-- limit are the statement's only parameters, so one prepared statement serves every batch size.
SELECT r.id, r.periodic_task_id, r.periodic_task_name, r.trigger, r.scheduled_for, r.due_at,
       r.task_id, r.reason, r.slots, r.claimed_by, r.dispatched_at, r.error, r.finished_at,
       r.buffered_at, clock_timestamp() AS db_now,
       CASE WHEN p.overlap_policy IN ({watching}) THEN
           (SELECT u.dispatched_at FROM {run} u
            WHERE u.periodic_task_id = r.periodic_task_id
              AND u.status IN ({unfinished})
            ORDER BY u.dispatched_at DESC NULLS LAST LIMIT 1)
       END AS busy_since,
       CASE WHEN p.overlap_policy IN ({buffering}) THEN
           (SELECT count(*) FROM {run} b
            WHERE b.periodic_task_id = r.periodic_task_id AND b.id <> r.id
              AND b.buffered_at IS NOT NULL AND b.status IN ({status.buffered}, {status.pending}))
       END AS waiting,
       (SELECT o.id FROM {pause} o
        WHERE o.periodic_task_id = r.periodic_task_id AND o.resumed_at IS NULL LIMIT 1) AS pause_id,
       t.id AS pk, t.name, t.task, t.enabled, t.one_off, t.start_time, t.expires,
       t.expire_seconds, t.last_run_at, t.total_run_count, t.date_changed, t.args, t.kwargs,
       t.headers, t.queue, t.exchange, t.routing_key, t.priority,
       t.interval_id, t.crontab_id, t.solar_id, t.clocked_id,
       i.every, i.period,
       c.minute, c.hour, c.day_of_month, c.month_of_year, c.day_of_week, c.timezone,
       s.event, s.latitude, s.longitude,
       k.clocked_time,
       p.misfire_policy, p.misfire_grace_seconds, p.catch_up_limit, p.overlap_policy,
       p.overlap_stale_seconds, p.jitter_seconds, p.buffer_limit, p.replace_started,
       v.version
FROM {run} r
LEFT JOIN {periodic_task} t ON t.id = r.periodic_task_id
LEFT JOIN {interval_schedule} i ON i.id = t.interval_id
LEFT JOIN {crontab_schedule} c ON c.id = t.crontab_id
LEFT JOIN {solar_schedule} s ON s.id = t.solar_id
LEFT JOIN {clocked_schedule} k ON k.id = t.clocked_id
LEFT JOIN {task_policy} p ON p.periodic_task_id = t.id
LEFT JOIN {task_version} v ON v.periodic_task_id = t.id
WHERE r.status = {status.pending} AND r.due_at >= %(floor)s AND r.due_at <= statement_timestamp()
ORDER BY r.due_at, r.id
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED

-- replace_not_started --
-- Overlap policy replace, in the claim's transaction: the unfinished runs of task %(task)s that
-- have not started (dispatched, buffered, or released and pending again; not the claim's own
-- runs, %(claimed)s) are skipped with reason %(reason)s: a delivery of one is dropped by the
-- guard. A run the guard is starting at this instant is waited for and then left alone (the
-- UPDATE reads the row again once its lock is free, and it is running then). Returns how many.
WITH ended AS (
    UPDATE {run} r SET status = {status.skipped}, reason = %(reason)s,
        finished_at = clock_timestamp()
    WHERE r.periodic_task_id = %(task)s AND r.id <> ALL(%(claimed)s)
      AND (r.status IN ({status.dispatched}, {status.buffered})
           OR (r.status = {status.pending} AND r.buffered_at IS NOT NULL))
    RETURNING r.id
)
SELECT count(*) FROM ended

-- replace_started --
-- Then, in a statement of its own (its snapshot sees a start committed meanwhile): the runs of
-- task %(task)s that have started (running, retrying) and were dispatched less than %(stale)s
-- (an interval: the staleness bound) ago, as (task id, dispatched_at); when %(terminate)s each
-- gets reason %(reason)s (the replica revokes them after its commit, and the outcome keeps the
-- reason). An older one is taken for lost: neither waited for nor terminated.
UPDATE {run} r SET reason = CASE WHEN %(terminate)s THEN %(reason)s ELSE r.reason END
WHERE r.periodic_task_id = %(task)s AND r.status IN ({status.running}, {status.retrying})
  AND (r.dispatched_at IS NULL OR r.dispatched_at >= clock_timestamp() - %(stale)s)
RETURNING r.task_id, r.dispatched_at

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

-- update_tasks --
-- last_run_at, total_run_count and enabled of the tasks a claim dispatched (arrays of task id,
-- newest slot, runs, disable), without moving django-celery-beat's change marker (no replica
-- reloads) or date_changed (the interval anchor); last_run_at never moves back (GREATEST
-- ignores a NULL). One statement: the task rows are locked in id order first (locked), so two
-- writers cannot deadlock, with FOR NO KEY UPDATE, the lock the UPDATE takes anyway: it leaves
-- the rows to the foreign-key checks (FOR KEY SHARE) of runs inserted elsewhere, which Django
-- defers to COMMIT and takes in the runs' order; FOR UPDATE made those wait, and a claim
-- committing its next runs deadlocked with a bookkeeping write holding some of the same tasks
-- (seen in the benchmark's lateness scenario: the claim rolled back after its messages went
-- out).
WITH v AS (
    SELECT * FROM unnest(%s::integer[], %s::timestamptz[], %s::integer[], %s::boolean[])
        AS v(id, last_slot, runs, disable)
), locked AS MATERIALIZED (
    SELECT t.id FROM {periodic_task} AS t WHERE t.id IN (SELECT id FROM v)
    ORDER BY t.id FOR NO KEY UPDATE OF t
)
UPDATE {periodic_task} AS t SET
    last_run_at = GREATEST(t.last_run_at, v.last_slot),
    total_run_count = t.total_run_count + v.runs,
    enabled = t.enabled AND NOT v.disable
FROM v JOIN locked AS l ON l.id = v.id
WHERE t.id = v.id

-- owe_run_counts --
-- In a claim's transaction: the scheduled runs it dispatched per task, owed to the task rows
-- until a settle (one row per task; arrays of task id, runs, newest slot).
INSERT INTO {owed_run_count} (periodic_task_id, runs, last_slot)
SELECT * FROM unnest(%s::integer[], %s::integer[], %s::timestamptz[])

-- settle_run_counts --
-- Move the owed counts onto the task rows and delete them, in one statement: rows another
-- settle holds are skipped (it counts them), rows of uncommitted claims are not seen yet (the
-- next settle counts them), so each owed row is counted once. The task rows are locked in id
-- order first (as update_tasks), so two writers cannot deadlock; last_run_at never moves back.
-- A deleted task's rows are deleted with nothing to update. Returns one row per task updated.
WITH owed AS (
    DELETE FROM {owed_run_count}
    WHERE id IN (SELECT id FROM {owed_run_count} FOR UPDATE SKIP LOCKED)
    RETURNING periodic_task_id, runs, last_slot
), summed AS (
    SELECT periodic_task_id AS id, sum(runs)::integer AS runs, max(last_slot) AS last_slot
    FROM owed GROUP BY periodic_task_id
), locked AS MATERIALIZED (
    SELECT t.id FROM {periodic_task} AS t JOIN summed AS s ON s.id = t.id
    ORDER BY t.id FOR NO KEY UPDATE OF t
)
UPDATE {periodic_task} AS t SET
    total_run_count = t.total_run_count + s.runs,
    last_run_at = GREATEST(t.last_run_at, s.last_slot)
FROM summed AS s JOIN locked AS l ON l.id = s.id
WHERE t.id = s.id
RETURNING t.id

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
WHERE r.status = {status.running} AND r.executions > 0 AND {fragment_lock_free}

-- close_lost --
-- Close the runs (id, executions) still running with their lock free as failed: worker lost,
-- each with its own error text.
WITH {fragment_held_locks}
UPDATE {run} AS r SET status = {status.failed}, reason = %s, error = v.error,
    finished_at = clock_timestamp()
FROM unnest(%s::bigint[], %s::integer[], %s::text[]) AS v(id, executions, error)
WHERE r.id = v.id AND r.executions = v.executions AND r.status = {status.running} AND {fragment_lock_free}
RETURNING r.id, r.executions, r.task_id, r.periodic_task_name

-- fragment_published_before_shortest_deadline --
-- Run r was last published before the shortest delivery deadline in force (a task policy's, or
-- %(timeout)s seconds) from the statement's start: a bound on the index scheduling_run_published
-- (a stable expression, which clock_timestamp() is not), so a pass reads the dispatched runs
-- that may be overdue, not a whole backlog of them. The exact, per-task condition follows it.
COALESCE(r.republished_at, r.dispatched_at) < statement_timestamp()
    - make_interval(secs => LEAST(%(timeout)s,
                                  (SELECT min(delivery_timeout_seconds) FROM {task_policy}))::float8)

-- overdue_deliveries --
-- Dispatched runs no worker started within their delivery deadline (the task policy's
-- delivery_timeout_seconds, else %(timeout)s seconds) since their last publish, oldest first,
-- locked for this pass; rows another replica is handling are skipped.
SELECT r.id
FROM {run} r LEFT JOIN {task_policy} p ON p.periodic_task_id = r.periodic_task_id
WHERE r.status = {status.dispatched}
  AND {fragment_published_before_shortest_deadline}
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
WHERE r.status = {status.dispatched}
  AND {fragment_published_before_shortest_deadline}
  AND COALESCE(r.republished_at, r.dispatched_at) < clock_timestamp()
      - make_interval(secs => (COALESCE(p.delivery_timeout_seconds, %(timeout)s) + %(grace)s)::float8)

-- lost_to_recover --
-- The runs (id, executions) to recover, locked, if still running with their lock free: a
-- redelivery that started one meanwhile holds its lock (or bumped executions) and keeps it.
WITH {fragment_held_locks}
SELECT r.id
FROM {run} r JOIN unnest(%s::bigint[], %s::integer[]) AS v(id, executions) ON r.id = v.id
WHERE r.status = {status.running} AND r.executions = v.executions AND {fragment_lock_free}
FOR UPDATE OF r SKIP LOCKED

-- append_run_events --
-- A re-publish pass's events, one per run (ids, kinds, details): appended to each run's events
-- at the pass's database clock (%s), in the pass's transaction.
UPDATE {run} r
SET events = coalesce(r.events, '[]'::jsonb)
    || jsonb_build_array(jsonb_build_object('at', %s::timestamptz, 'kind', e.kind,
                                            'detail', e.detail))
FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS e(id, kind, detail)
WHERE r.id = e.id

-- record_retry --
-- A running run's attempt is being retried by Celery: retrying, its error, and a retry event
-- (its detail names the attempt; with the attempt's start and worker, which the next attempt's
-- start overwrites on the row). Params: error, detail, task id, retries (the retrying attempt's
-- request.retries; NULL: any attempt). Returns the run's id when one was running.
UPDATE {run}
SET status = {status.retrying}, error = %(error)s,
    events = coalesce(events, '[]'::jsonb)
        || jsonb_build_array(jsonb_build_object('at', clock_timestamp(), 'kind', 'retry',
                                                'detail', %(detail)s, 'started', started_at,
                                                'worker', worker))
WHERE task_id = %(task_id)s AND status = {status.running}
  AND (%(retries)s::integer IS NULL OR retries = %(retries)s::integer)
RETURNING id

-- try_execution_lock --
-- The guard takes the execution lock of one attempt (task id, retries) on its own session.
SELECT pg_try_advisory_lock(scheduling_execution_lock_key(%s, %s))

-- release_execution_lock --
SELECT pg_advisory_unlock(scheduling_execution_lock_key(%s, %s))

-- start_execution --
-- A delivery's start on the worker's own session, one call (schema.sql, guard_execution): the
-- execution lock of its attempt (task id, retries), taken without waiting, and, when it was
-- free, the run started if it is dispatched (its first delivery: running, started_at, worker,
-- retries, one execution more). Returns (lock taken, run id started or NULL); any other case
-- (no lock, a run in another status, no run) is decided by ledger.begin_execution with the lock
-- as taken here.
SELECT mine, run_id
FROM scheduling_start_execution(%(task_id)s, %(retries)s, %(worker)s)

-- finish_execution --
-- A guarded attempt's outcome, on the worker's own session, one call (schema.sql,
-- guard_execution): the run's final status, finished_at, error (ledger.record_finished's rule: a
-- run not finished, or closed "worker lost" whose attempt did finish after all, reason then
-- %(late)s), and, when %(held)s, the attempt's execution lock released after the run's row is
-- locked: a redelivery taking the freed lock waits for this commit and finds the run finished.
-- Returns (runs updated, unlocked or NULL).
SELECT updated, unlocked
FROM scheduling_finish_execution(
    %(task_id)s, %(retries)s, %(status)s, %(error)s, %(late)s, %(held)s)

-- guard_keepalives --
-- The guard's lock session: the server frees the execution locks of a worker cut off silently
-- within the keepalive bound (session.Keepalives), whether or not it has data in flight.
SELECT set_config('tcp_keepalives_idle', %s, false),
       set_config('tcp_keepalives_interval', %s, false),
       set_config('tcp_keepalives_count', %s, false),
       set_config('tcp_user_timeout', %s, false)

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

-- prune_async_commit --
-- This transaction's commit does not wait for its WAL to reach disk (asynchronous commit): a
-- crash may undo a prune's last batches, which the next pass deletes again; nothing depends on a
-- delete being durable. Every other write of the ledger commits synchronously.
SELECT set_config('synchronous_commit', 'off', true)

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

-- health_counts --
-- The schedule health page: the runs of the page's periodic tasks in [start, end) by task,
-- trigger and status (the count columns add up to the runs). scheduling_run_recent
-- (periodic_task, -scheduled_for) serves the range per task.
SELECT periodic_task_id, trigger, status, count(*)
FROM {run}
WHERE periodic_task_id = ANY(%(tasks)s) AND scheduled_for >= %(start)s AND scheduled_for < %(end)s
GROUP BY periodic_task_id, trigger, status

-- health_lateness --
-- The p95 and largest lateness (dispatched_at - due_at, seconds: from the jittered due moment)
-- of each task's dispatched scheduled runs in [start, end): manual runs and backfills are not
-- late by schedule.
SELECT periodic_task_id,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM dispatched_at - due_at)::float8),
       max(extract(epoch FROM dispatched_at - due_at))::float8
FROM {run}
WHERE periodic_task_id = ANY(%(tasks)s) AND scheduled_for >= %(start)s AND scheduled_for < %(end)s
  AND trigger = {trigger.schedule} AND dispatched_at IS NOT NULL
GROUP BY periodic_task_id

-- health_buckets --
-- The chart's marks: per task, bucket (%(step)s seconds from %(origin)s), trigger and status
-- in [start, end): how many runs, the first and last slot, the largest lateness (seconds) and
-- one error or reason (the longest-sorting one, cut to 160 characters) as an example.
SELECT periodic_task_id,
       floor(extract(epoch FROM scheduled_for - %(origin)s) / %(step)s)::integer AS bucket,
       trigger, status, count(*), min(scheduled_for), max(scheduled_for),
       max(extract(epoch FROM dispatched_at - due_at))::float8,
       max(left(coalesce(nullif(error, ''), reason), 160))
FROM {run}
WHERE periodic_task_id = ANY(%(tasks)s) AND scheduled_for >= %(start)s AND scheduled_for < %(end)s
GROUP BY periodic_task_id, bucket, trigger, status

-- mark_overdue --
-- The overdue pass (scheduling.overdue): scheduled runs that have not succeeded within their
-- task's success deadline after the slot (the policy's success_deadline_seconds, else
-- %(deadline)s seconds; neither: never), not found overdue before, oldest first, at most
-- %(limit)s, each marked with the database clock by one replica only: rows another session holds
-- are skipped, and a row another replica marked meanwhile fails "overdue_at IS NULL" when the
-- UPDATE re-reads it. Skipped runs (overlap, pause) and cancelled plans are never overdue. The
-- reach (shortest deadline in use, longest plus %(lookback)s seconds) bounds the scan of the
-- partial index scheduling_run_overdue_watch to the slots that can be due; without any deadline
-- the scan is empty.
WITH reach AS MATERIALIZED (
    SELECT min(d) AS shortest, max(d) AS longest FROM (
        SELECT success_deadline_seconds::float8 AS d FROM {task_policy}
        WHERE success_deadline_seconds IS NOT NULL
        UNION ALL SELECT %(deadline)s::float8 WHERE %(deadline)s::float8 IS NOT NULL) AS used
),
due AS (
    SELECT r.id, COALESCE(p.success_deadline_seconds::float8, %(deadline)s::float8) AS deadline
    FROM {run} r LEFT JOIN {task_policy} p ON p.periodic_task_id = r.periodic_task_id
    WHERE r.trigger = {trigger.schedule} AND r.overdue_at IS NULL
      AND r.status NOT IN ({status.succeeded}, {status.cancelled}, {status.skipped})
      AND r.scheduled_for <= statement_timestamp()
          - make_interval(secs => (SELECT shortest FROM reach))
      AND r.scheduled_for > statement_timestamp()
          - make_interval(secs => (SELECT longest FROM reach) + %(lookback)s)
      AND r.scheduled_for <= clock_timestamp() - make_interval(
          secs => COALESCE(p.success_deadline_seconds::float8, %(deadline)s::float8))
    ORDER BY r.scheduled_for, r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE {run} AS r SET overdue_at = clock_timestamp()
FROM due
WHERE r.id = due.id AND r.overdue_at IS NULL
RETURNING r.id, r.periodic_task_id, r.periodic_task_name, r.task, r.task_id, r.scheduled_for,
    r.status, r.overdue_at, due.deadline

-- overdue_tasks --
-- Periodic tasks overdue now: those with a run marked overdue within the last %(window)s seconds
-- and no succeeded run of the task at or after that run's slot (a later success, or the run's own
-- late one, ends it). Per task name: the overdue runs since, and the oldest slot among them.
-- Runs of deleted tasks do not count. Served by the partial index scheduling_run_overdue.
SELECT r.periodic_task_name, count(*), min(r.scheduled_for)
FROM {run} r
WHERE r.overdue_at IS NOT NULL AND r.periodic_task_id IS NOT NULL
  AND r.overdue_at > clock_timestamp() - make_interval(secs => %(window)s::float8)
  AND NOT EXISTS (
      SELECT 1 FROM {run} s
      WHERE s.periodic_task_id = r.periodic_task_id AND s.status = {status.succeeded}
        AND s.scheduled_for >= r.scheduled_for)
GROUP BY r.periodic_task_name
ORDER BY r.periodic_task_name

-- set_actor --
-- Who makes the edits of this transaction (an admin user), for the edit history's triggers
-- (schema.sql's history block reads it: current_setting('scheduling.actor', true)).
-- Transaction-local: it ends with the transaction, so it never reaches a pooler's next client.
SELECT set_config('scheduling.actor', %s, true)

-- schedule_changes_prune --
-- Delete the change-log rows past ledger.CHANGE_RETENTION (%s, an interval); return what settles
-- a row (ledger.changes.SettledChanges): the database clock, the start of the oldest transaction
-- open in another client session of this database (NULL: none), and whether a session hides it
-- (another role's, without pg_read_all_stats: its state is NULL). Autovacuum and the server's
-- own processes plan no run and are left out. Run before the rows are read: every row changed
-- before that start is visible to them.
WITH pruned AS (DELETE FROM {schedule_change} WHERE changed_at < clock_timestamp() - %s)
SELECT clock_timestamp(),
       min(xact_start),
       coalesce(bool_or(state IS NULL), false)
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND backend_type = 'client backend'
   AND pid <> pg_backend_pid()

-- schedule_changes --
-- The change log as a reconcile pass reads it: (id, kind, object id, changed_at, the database clock
-- after the statement's snapshot), the rows changed since %(since)s (below it every row is
-- settled: ledger.changes.SettledChanges), at most %(limit)s (NULL: all).
SELECT id, kind, object_id, changed_at, clock_timestamp() FROM {schedule_change}
 WHERE changed_at >= %(since)s
 LIMIT %(limit)s

-- fragment_named_by_schedule --
-- Periodic task t uses a schedule row the change log names (ledger.changes.affected), by kind; the
-- parameters are arrays of ids (empty when no row of that kind changed).
(t.interval_id = ANY(%(interval)s) OR t.crontab_id = ANY(%(crontab)s)
 OR t.solar_id = ANY(%(solar)s) OR t.clocked_id = ANY(%(clocked)s))

-- fragment_cancel_orphans --
-- Cancel the runs the query's "orphan" CTE picked (up to %(limit)s, locked, skipping those a
-- claim holds): (whether its task was deleted) per run.
UPDATE {run} r
   SET status = {status.cancelled}, finished_at = clock_timestamp(),
       reason = CASE WHEN o.deleted THEN %(deleted)s ELSE %(disabled)s END
  FROM orphan o
 WHERE r.id = o.id
RETURNING o.deleted

-- orphan_runs_of_deleted --
-- One batch of the pending runs of deleted tasks (a pass that no change names a task in).
WITH orphan AS (
    SELECT r.id, TRUE AS deleted
      FROM {run} r
     WHERE r.status = {status.pending} AND r.periodic_task_id IS NULL
     LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED)
{fragment_cancel_orphans}

-- orphan_runs --
-- The same, and the pending scheduled runs of the disabled tasks among %(tasks)s (an array of
-- ids; NULL: among every task, a full pass).
WITH orphan AS (
    SELECT r.id, r.periodic_task_id IS NULL AS deleted
      FROM {run} r LEFT JOIN {periodic_task} t ON t.id = r.periodic_task_id
     WHERE r.status = {status.pending}
       AND (r.periodic_task_id IS NULL
            OR (r.trigger = {trigger.schedule} AND NOT t.enabled
                AND (%(tasks)s::integer[] IS NULL OR r.periodic_task_id = ANY(%(tasks)s))))
     LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED)
{fragment_cancel_orphans}

-- fragment_stale_plan --
-- Periodic task t is enabled and has a pending scheduled run not yet due that was planned from an
-- older definition than its current one: its Run.definition_version is not TaskVersion's (the
-- history triggers add 1 to it in the editing transaction, for any change of the task, its
-- schedule row or its policy), or either is unknown. Only such a run can need re-planning
-- (reconcile.replan_edited): a plan made from the current definition is what planning would
-- make now.
(t.enabled AND EXISTS (
    SELECT 1
      FROM {run} r LEFT JOIN {task_version} v ON v.periodic_task_id = r.periodic_task_id
     WHERE r.periodic_task_id = t.id
       AND r.status = {status.pending} AND r.trigger = {trigger.schedule} AND r.due_at > clock_timestamp()
       AND (r.definition_version IS NULL OR v.version IS NULL
            OR r.definition_version <> v.version)))

-- fragment_unplanned --
-- Periodic task t is enabled and has no pending scheduled run: what planning.plan_missing may
-- plan (it also leaves paused tasks alone).
(t.enabled AND NOT EXISTS (SELECT 1 FROM {run} r
                            WHERE r.periodic_task_id = t.id
                              AND r.status = {status.pending} AND r.trigger = {trigger.schedule}))

-- stale_plans --
-- Whether a task the change log names, by its id (%(task)s) or by its schedule row's, has a stale
-- plan (fragment_stale_plan). So a replica's pass after another's, which re-planned the edit,
-- reads the tasks named and nothing else. The tasks named by id are looked up one by one by
-- primary key (a LATERAL subquery with LIMIT: a nested loop the planner cannot turn into a
-- join): for a few thousand ids (a bulk disable) its costs chose a parallel scan of every
-- periodic task instead, 140 to 160 ms at a million tasks, where 4,000 probes take 5 ms.
SELECT EXISTS (
    SELECT 1
      FROM unnest(%(task)s::integer[]) AS named(id)
     CROSS JOIN LATERAL (SELECT 1 FROM {periodic_task} t
                          WHERE t.id = named.id AND {fragment_stale_plan} LIMIT 1) AS found)
    OR EXISTS (SELECT 1 FROM {periodic_task} t
                WHERE {fragment_named_by_schedule} AND {fragment_stale_plan})

-- unplanned_tasks --
-- Whether a task the change log names (by id in %(task)s, with those claims noted as unplanned,
-- or by its schedule row's) is unplanned (fragment_unplanned); looked up as in stale_plans.
SELECT EXISTS (
    SELECT 1
      FROM unnest(%(task)s::integer[]) AS named(id)
     CROSS JOIN LATERAL (SELECT 1 FROM {periodic_task} t
                          WHERE t.id = named.id AND {fragment_unplanned} LIMIT 1) AS found)
    OR EXISTS (SELECT 1 FROM {periodic_task} t
                WHERE {fragment_named_by_schedule} AND {fragment_unplanned})

-- ledger_size --
-- The schedule health page: the ledger's runs, its table's bytes on disk (indexes and TOAST
-- included) and its oldest run's slot, in one read of the whole table.
SELECT count(*), pg_total_relation_size('{run}'), min(scheduled_for) FROM {run}
