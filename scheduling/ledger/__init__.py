"""The run ledger's use cases: every transaction and row lock of the app is in this package.

One module per concept, each the only writer of what it names:

- ``session``: the scheduler session's server-side bounds, the poll, the advisory locks, the stop;
- ``floor``: where a replica's poll and claim start their scans (dead entries skipped);
- ``pooler``: a connection pooler in between: telling one is there, and what it keeps;
- ``changes``: the change log that reconcile passes read;
- ``reconcile``: cancel what was deleted or disabled, re-plan edits (``planning`` plans);
- ``planning``: the next slot of tasks without a pending run, tolerant of bad rows;
- ``claim``: claim, decide (``policy``: pure misfire and overlap decisions), publish, commit;
- ``delivery``: dispatched runs no worker started, and lost runs to recover, published again;
- ``claimed``: the claim statement's rows as claimed runs and tasks (tuples), sent prepared;
- ``writes``: bulk inserts and updates of runs and tasks;
- ``bookkeeping``: the tasks' ``last_run_at``/``total_run_count``, owed by claims, settled later;
- ``manual``: manual runs and backfills;
- ``pausing``: pause and resume a task (who, when, why; one skipped run for the slots passed);
- ``execution``: the worker side (start, the duplicate guard's verdict written, outcome);
- ``verdict``: the duplicate guard's verdict on one delivery (pure: the rule, as a table);
- ``lost``: running runs whose worker died;
- ``prune``: deleting old finished runs;
- ``overdue``: runs not succeeded within their task's success deadline, marked once.
- ``history``: who makes an edit, told to the edit history's triggers.

SQL text lives in ``scheduling.sql`` (named statements in ``queries.sql``; the bulk writers'
statements composed in ``scheduling.sql.compose``). The names below are the package's public
surface; modules outside the package import them from here.
"""

from scheduling.clock import ClockTimestamp, database_now
from scheduling.ledger.actor import acting, set_actor
from scheduling.ledger.bookkeeping import TaskBook
from scheduling.ledger.changes import CHANGE_RETENTION, SettledChanges, note_unplanned
from scheduling.ledger.claim import FLUSH_EVERY, Dispatched, Publish, claim_and_dispatch
from scheduling.ledger.delivery import Redelivered, Republisher, redeliver
from scheduling.ledger.execution import (
    begin_execution,
    record_finished,
    record_not_executed,
    record_retry,
    record_started,
)
from scheduling.ledger.floor import DueFloor
from scheduling.ledger.lost import LostExecutions, close_lost_executions
from scheduling.ledger.manual import (
    BackfillProgress,
    backfill,
    no_slot_reason,
    request_run,
    run_now_refusal,
    slots_before_creation,
)
from scheduling.ledger.overdue import Overdue, mark_overdue
from scheduling.ledger.pausing import pause, resume
from scheduling.ledger.planning import plan_missing
from scheduling.ledger.policy import MISSED_ROWS_LIMIT, MisfireDecision
from scheduling.ledger.pooler import keeps_prepared, pooled
from scheduling.ledger.prune import PrunePlan, prune, prune_batch, prune_counts, prune_plan
from scheduling.ledger.reconcile import reconcile, replan_edited
from scheduling.ledger.session import (
    NO_FLOOR,
    Poll,
    application_name,
    beat_schedule_sync,
    close_sessions,
    configure_session,
    poll,
    ready_for_stop,
    reconcile_turn,
    server_address,
)
from scheduling.ledger.verdict import Outcome, Verdict

__all__ = [
    "CHANGE_RETENTION",
    "FLUSH_EVERY",
    "MISSED_ROWS_LIMIT",
    "NO_FLOOR",
    "BackfillProgress",
    "ClockTimestamp",
    "Dispatched",
    "DueFloor",
    "LostExecutions",
    "MisfireDecision",
    "Outcome",
    "Overdue",
    "Poll",
    "PrunePlan",
    "Publish",
    "Redelivered",
    "Republisher",
    "SettledChanges",
    "TaskBook",
    "Verdict",
    "acting",
    "application_name",
    "backfill",
    "beat_schedule_sync",
    "begin_execution",
    "claim_and_dispatch",
    "close_lost_executions",
    "close_sessions",
    "configure_session",
    "database_now",
    "keeps_prepared",
    "mark_overdue",
    "no_slot_reason",
    "note_unplanned",
    "pause",
    "plan_missing",
    "poll",
    "pooled",
    "prune",
    "prune_batch",
    "prune_counts",
    "prune_plan",
    "ready_for_stop",
    "reconcile",
    "reconcile_turn",
    "record_finished",
    "record_not_executed",
    "record_retry",
    "record_started",
    "redeliver",
    "replan_edited",
    "request_run",
    "resume",
    "run_now_refusal",
    "server_address",
    "set_actor",
    "slots_before_creation",
]
