"""Claim and dispatch: lock due runs, publish them, mark them dispatched, plan the next; one
transaction.

The claim is the row lock of ``SELECT ... FOR UPDATE SKIP LOCKED`` (the statement ``claim`` of
``scheduling/sql/queries.sql``; its rows become ``claim_rows.ClaimedRun``), so it lives exactly as
long as this transaction: commit, rollback, or the connection dying all end it (invariant 2).
Each claimed run is decided by ``decision.decide`` (pure: load error, deleted or disabled task,
expiry, pause, misfire policy, overlap policy) and the decision is applied in one place
(``_Batch.apply``): publish, close, record missed, skipped or buffered, then plan the next slot.

The overlap policies that wait (``TaskPolicy.BUFFERING``) are ``decision.decide``'s; the
claim records a buffered run (``buffered_at``: now) and, under replace, ends the task's
unfinished runs (``replace``) and revokes a started one after its commit when the policy says
terminate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from scheduling.conf import conf
from scheduling.durations import seconds
from scheduling.exceptions import PublishFailed, RunRejected
from scheduling.ledger.bookkeeping import TaskBook
from scheduling.ledger.changes import note_unplanned
from scheduling.ledger.claim_rows import ClaimedRun, ClaimedTask, claim_rows, claimed_runs
from scheduling.ledger.decision import Decision, Kind, decide
from scheduling.ledger.writes import (
    ERROR_LIMIT,
    TaskUpdate,
    insert_pending,
    insert_runs,
    planned_run,
    update_runs,
    update_tasks,
)
from scheduling.ledger.policy import stale_bound
from scheduling.ledger.replace import replace_unfinished
from scheduling.models import Pause, Run, TaskPolicy
from scheduling.run_message import Message, build_message

logger = logging.getLogger(__name__)

Publish = Callable[[Message], None]
#: Published runs a claim lets a buffering publisher hold before its first flush: the first runs
#: reach the broker after one round trip, and no message waits for the whole batch to be built.
#: Each later flush holds twice as many as the one before (16, 32, 64, ...): a claim of n runs
#: makes about log2(n / 16) round trips to the broker, not n / 16.
FLUSH_EVERY = 16
#: The run fields a claim writes back.
_CLAIM_FIELDS = (
    "status", "reason", "slots", "claimed_by", "dispatched_at", "error", "finished_at",
    "buffered_at",
)


@dataclass(frozen=True)
class Dispatched:
    """A run this replica committed as dispatched (or failed/cancelled while claiming)."""

    run_id: int
    periodic_task_name: str
    status: str
    lateness: float | None
    task_id: str
    trigger: str = "schedule"
    #: What the misfire policy did with a late run: "missed", "coalesced", "caught_up" or "".
    misfire: str = ""
    #: Slots that misfire covered: missed rows' slots, a coalesced run's slots, 1 caught up.
    misfired_slots: int = 0
    reason: str = ""
    #: Unfinished runs of its task it ended (overlap policy replace): skipped, or terminated.
    replaced: int = 0


def claim_and_dispatch(
    publish: Publish,
    *,
    replica_id: str,
    batch_size: int,
    grace: timedelta,
    flush: Callable[[], None] | None = None,
    book: TaskBook | None = None,
    floor: datetime | None = None,
    revoke: Callable[[list[str]], None] | None = None,
    using: str = "default",
) -> list[Dispatched]:
    """Claim due pending runs, publish them, mark them dispatched, plan the next; one transaction.

    ``publish(message)`` sends one Celery message; it raises RunRejected for a run that cannot be
    sent (the run is recorded failed and the others go on) and lets broker errors propagate, which
    rolls the whole claim back so nothing is marked dispatched unless its publish succeeded.
    ``flush()``, when given, sends what a buffering publisher holds (kombu's ``Producer.batch``:
    one Redis pipeline); it is called after the first FLUSH_EVERY published runs, then after
    twice as many as the flush before held each time, and after the last,
    before the ledger writes, and each run's ``dispatched_at`` is the moment its flush returned,
    so lateness is measured to the broker. Its errors roll the claim back like a publish error.
    ``book``, when given, is owed the ``last_run_at``/``total_run_count`` of the dispatched
    runs' tasks, in the claim (``bookkeeping.TaskBook.owe``: one INSERT; a replica's settle
    writes them later); without it they are written in the claim. A task whose schedule the
    claim ended is written in the claim either way (``enabled`` off with the commit).
    ``floor``: runs due before it are not claimed (the replica's ``DueFloor``; None: every due
    run). ``revoke(task_ids)`` is called after the commit with the started runs overlap policy
    replace terminates (the replica's ``celery.app.control.Control.revoke``); None: they finish.
    Returns what was committed; an empty list when nothing was due or every due run is being
    claimed by another replica.

    What happens to each claimed run (misfire, pause, overlap policies) is
    ``decision.decide``'s.
    """
    with transaction.atomic(using=using):
        claimed = claim_due(batch_size, using, floor)
        if not claimed:
            return []
        _load_pauses(claimed, using)
        batch = _Batch(publish, flush, replica_id, grace, claimed[0].db_now, using)
        batch.claimed_ids = [run.id for run in claimed]
        for run in claimed:
            batch.take(run)
        batch.send()
        batch.write(claimed, book, using)
        _link_pauses(claimed, using)
    if batch.terminate:
        _revoke(revoke, batch.terminate)
    result = [_dispatched(run) for run in claimed]
    for done in result:
        _log(done, replica_id)
    return result


class _Batch:
    """One claim's working state: what it decided, published and owes the ledger."""

    def __init__(
        self,
        publish: Publish,
        flush: Callable[[], None] | None,
        replica_id: str,
        grace: timedelta,
        claimed_at: datetime,
        using: str,
    ) -> None:
        self.publish, self.flush, self.replica_id, self.grace = publish, flush, replica_id, grace
        self.claimed_at, self.started, self.using = claimed_at, time.monotonic(), using
        self.claimed_ids: list[int] = []
        self.terminate: list[str] = []  # task ids of started runs overlap replace revokes
        self.default_stale = conf.overlap_stale_seconds
        self.following: list[tuple[ClaimedTask, datetime]] = []
        self.missed: list[Run] = []
        self.task_updates: dict[int, TaskUpdate] = {}
        self.busy: dict[int, ClaimedRun] = {}  # task -> its run dispatched in this claim
        self.waiting: dict[int, int] = {}  # task -> runs waiting more (+) or fewer (-) than read
        self.unplanned: set[int] = set()
        self.unsent: list[ClaimedRun] = []
        self.flush_at = FLUSH_EVERY  # runs the next flush holds: doubled after each

    def now(self) -> datetime:
        """The database clock now: the claim's reading plus the time spent since (aware UTC)."""
        return self.claimed_at + timedelta(seconds=time.monotonic() - self.started)

    def take(self, run: ClaimedRun) -> None:
        """Decide one claimed run, apply the decision, and account for it on its task."""
        now = self.now()
        run.claimed_by = self.replica_id
        mark = len(self.missed)  # rows after it: the slots this run's misfire records missed
        try:
            decision = self.decide(run, now)
            self.apply(run, decision, now)
        except PublishFailed:
            raise  # the broker: roll the whole claim back
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the batch
            logger.exception(
                "cannot dispatch run %s of %r", run.task_id, run.periodic_task_name,
                extra={"action": "dispatch_failed"},
            )
            decision = Decision(
                Kind.CLOSE, Run.Status.FAILED, Run.Reason.DISPATCH_ERROR, error=repr(exc)
            )
            self.apply(run, decision, now)
        run.missed_after = sum(row.slots for row in self.missed[mark:])
        self.account(run, decision)

    def decide(self, run: ClaimedRun, now: datetime) -> Decision:
        """``decision.decide`` on the claimed run's fields; logs why it failed or has no next
        slot."""
        if run.load_error:
            logger.error(
                "run %s failed: %s", run.task_id, run.load_error, extra={"action": "load_failed"}
            )
        decision = decide(
            run.periodic_task, trigger=run.trigger, slot=run.scheduled_for, due=run.due_at,
            now=now, grace=self.grace, default_stale=self.default_stale,
            load_error=run.load_error, pause=run.pause,
            in_batch=run.periodic_task_id in self.busy, busy_since=run.busy_since,
            waiting=(run.waiting or 0) + self.waiting.get(run.periodic_task_id, 0),
            released=run.buffered_at is not None,
        )
        if decision.plan_error:
            logger.error(
                "cannot plan the run after %s of %r: %s", run.scheduled_for,
                getattr(run.periodic_task, "name", ""), decision.plan_error,
                extra={"action": "plan"},
            )
        return decision

    def apply(self, run: ClaimedRun, decision: Decision, now: datetime) -> None:
        """Write ``decision`` onto the claimed run: the one place a decision takes effect."""
        run.misfire = decision.misfire
        if decision.slots is not None:
            run.slots = decision.slots
        match decision.kind:
            case Kind.DISPATCH:
                if decision.reason is not None:
                    run.reason = decision.reason
                self.dispatch(run, now)
            case Kind.MISS:
                close(run, decision.status, decision.reason or "", now)
                self.record_missed(run, decision, now)
            case Kind.CLOSE | Kind.SKIP:
                close(run, decision.status, decision.reason or "", now, error=decision.error)
            case Kind.BUFFER:
                self.buffer(run, decision.reason or "", now)
            case Kind.REPLACE:
                if decision.reason is not None:
                    run.reason = decision.reason
                self.replace(run, now)

    def buffer(self, run: ClaimedRun, reason: str, now: datetime) -> None:
        """Record the run buffered: it waits until the task's busy run ends."""
        if run.buffered_at is None:  # a released run waited already: counted as waiting
            self.waiting[run.periodic_task_id] = self.waiting.get(run.periodic_task_id, 0) + 1
            run.buffered_at = now
        run.status, run.reason = Run.Status.BUFFERED, reason

    def replace(self, run: ClaimedRun, now: datetime) -> None:
        """Overlap policy replace: end the task's unfinished runs, then dispatch ``run``, or
        buffer it behind a started one (left to finish, or revoked with terminate after the
        commit: ``TaskPolicy.replace_started``). A run of the task dispatched earlier in this
        claim is skipped in memory (its message is out; the guard drops it), unless its slot is
        the newer one, which then replaces this run."""
        task = run.periodic_task
        assert task is not None and task.scheduling_policy is not None
        earlier = self.busy.get(task.pk)
        if earlier is not None and earlier.scheduled_for > run.scheduled_for:
            close(run, Run.Status.SKIPPED, Run.Reason.replaced(earlier.scheduled_for), now)
            return
        reason = Run.Reason.replaced(run.scheduled_for)
        if earlier is not None:
            close(earlier, Run.Status.SKIPPED, reason, now)
        policy = task.scheduling_policy
        terminate = policy.replace_started == TaskPolicy.ReplaceStarted.TERMINATE
        ended, started = replace_unfinished(
            task.pk, self.claimed_ids, reason, terminate=terminate,
            stale=stale_bound(policy, self.default_stale), using=self.using,
        )
        run.replaced = ended + (earlier is not None) + (len(started) if terminate else 0)
        if not started:
            self.dispatch(run, now)
            return
        if terminate:
            self.terminate.extend(task_id for task_id, _ in started)
        self.buffer(run, Run.Reason.buffered(started[0][1]), now)

    def dispatch(self, run: ClaimedRun, now: datetime) -> None:
        """Publish the run (failed when its message is rejected) and mark it dispatched."""
        task = run.periodic_task
        assert task is not None
        try:
            message = build_message(run, task, now)
            try:
                self.publish(message)
            except RunRejected:
                raise
            except Exception as exc:
                raise PublishFailed(f"cannot publish run {run.task_id}: {exc}") from exc
        except RunRejected as exc:
            logger.error(
                "run of %r at %s rejected: %s", task.name, run.scheduled_for, exc,
                extra={"action": "reject"},
            )
            close(run, Run.Status.FAILED, Run.Reason.REJECTED, now, error=str(exc))
            return
        run.status = Run.Status.DISPATCHED
        run.dispatched_at = now
        self.unsent.append(run)
        if len(self.unsent) >= self.flush_at:
            self.send()
            self.flush_at *= 2
        self.busy[task.pk] = run
        if run.buffered_at is not None:  # a released run: one fewer waits
            self.waiting[task.pk] = self.waiting.get(task.pk, 0) - 1

    def record_missed(self, run: ClaimedRun, decision: Decision, now: datetime) -> None:
        """Queue the rows of the slots a misfire records missed after the run, and log it."""
        task, late = run.periodic_task, decision.misfire
        assert task is not None and late is not None
        rows = [
            planned_run(
                task, slot, status=Run.Status.MISSED, reason=late.reason,
                claimed_by=self.replica_id, finished_at=now,
            )
            for slot in late.missed
        ]
        if rows:
            rows[-1].slots = late.last_row_slots
        self.missed.extend(rows)
        policy = task.scheduling_policy
        logger.warning(
            "misfire of %r: %d slots from %s recorded missed (%s policy)",
            task.name, late.misfired_slots, run.scheduled_for,
            policy.misfire_policy if policy is not None else "", extra={"action": "misfire"},
        )

    def account(self, run: ClaimedRun, decision: Decision) -> None:
        """Owe a scheduled run's task its bookkeeping, and plan its next slot (or say why not)."""
        task = run.periodic_task
        if task is None or run.trigger != Run.Trigger.SCHEDULE:
            return
        update = self.task_updates.setdefault(task.pk, TaskUpdate())
        if run.status == Run.Status.DISPATCHED:
            update.ran(run.scheduled_for)
        update.disable = update.disable or decision.over
        if decision.next_slot is not None:
            self.following.append((task, decision.next_slot))
        elif (
            not decision.planned and not decision.over and task.enabled
            and run.status != Run.Status.CANCELLED and run.pause is None
        ):
            self.unplanned.add(task.pk)  # its schedule gave no next slot: reconcile says why

    def send(self) -> None:
        """Flush what the publisher holds; each flushed run is dispatched when it returned."""
        if self.flush is not None and self.unsent:
            _flush(self.flush, self.unsent)
            sent_at = self.now()
            for published in self.unsent:
                published.dispatched_at = sent_at
        self.unsent.clear()

    def write(self, claimed: list[ClaimedRun], book: TaskBook | None, using: str) -> None:
        """Write the claim's outcomes: the runs, the missed rows, the next slots, the tasks."""
        # Not in a psycopg pipeline: after one, PostgreSQL did not end the session when it then
        # sat idle in the transaction, and that bound is what frees a frozen replica's claim.
        update_runs(claimed, _CLAIM_FIELDS, using)
        insert_runs(self.missed, using)
        insert_pending(self.following, using)
        updates = self.task_updates
        owed = {pk: u for pk, u in updates.items() if book is not None and not u.disable}
        update_tasks({pk: u for pk, u in updates.items() if pk not in owed}, using)
        if book is not None:
            book.owe(owed, using)  # durable with the dispatches it counts
        if self.unplanned:
            note_unplanned(self.unplanned, using)


def _dispatched(run: ClaimedRun) -> Dispatched:
    decision = run.misfire
    outcome, misfired = "", 0
    if decision is not None and run.status == Run.Status.MISSED:
        outcome, misfired = decision.outcome, run.slots + run.missed_after
    elif decision is not None and run.status == Run.Status.DISPATCHED:
        outcome, misfired = decision.outcome, decision.misfired_slots
    return Dispatched(
        run_id=run.pk,
        periodic_task_name=run.periodic_task_name,
        status=run.status,
        lateness=seconds(run.lateness),
        task_id=run.task_id,
        trigger=run.trigger,
        misfire=outcome,
        misfired_slots=misfired,
        reason=run.reason,
        replaced=run.replaced,
    )


_ACTIONS = {Run.Status.SKIPPED: "skip", Run.Status.BUFFERED: "buffer"}


def _log(done: Dispatched, replica_id: str) -> None:
    if done.status == Run.Status.DISPATCHED:
        logger.info(
            "dispatched %s (task id %s), lateness %.3fs",
            done.periodic_task_name, done.task_id, done.lateness or 0.0,
            extra={"action": "dispatch", "replica": replica_id},
        )
    elif done.status in (Run.Status.SKIPPED, Run.Status.BUFFERED):
        logger.info(
            "%s %s (task id %s): %s", done.status, done.periodic_task_name, done.task_id,
            done.reason, extra={"action": _ACTIONS[done.status], "replica": replica_id},
        )
    elif done.status == Run.Status.CANCELLED:
        logger.info(
            "cancelled %s (task id %s): %s", done.periodic_task_name, done.task_id,
            done.reason, extra={"action": "cancel", "replica": replica_id},
        )


def _load_pauses(claimed: list[ClaimedRun], using: str) -> None:
    """Load the open pauses of the claimed scheduled runs whose task is paused (one query)."""
    ids = {
        run.pause_id for run in claimed
        if run.pause_id is not None and run.trigger == Run.Trigger.SCHEDULE
    }
    if not ids:
        return
    pauses = Pause.objects.using(using).in_bulk(sorted(ids))
    for run in claimed:
        if run.trigger == Run.Trigger.SCHEDULE and run.pause_id is not None:
            run.pause = pauses.get(run.pause_id)


def _link_pauses(claimed: list[ClaimedRun], using: str) -> None:
    """Link each pause to the first run it skipped (the row ``ledger.resume`` completes)."""
    for run in claimed:
        if run.pause is not None and run.status == Run.Status.SKIPPED and run.buffered_at is None:
            Pause.objects.using(using).filter(pk=run.pause.pk, run__isnull=True).update(
                run=run.id
            )


def _revoke(revoke: Callable[[list[str]], None] | None, task_ids: list[str]) -> None:
    """Revoke, with terminate, the started runs a committed claim replaced (overlap policy
    replace); a failure is logged: the runs then finish, and the runs replacing them wait."""
    try:
        if revoke is None:
            raise RuntimeError("this claim has no way to revoke")
        revoke(task_ids)
    except Exception:  # noqa: BLE001 - the claim is committed; the runs finish instead
        logger.exception(
            "cannot revoke the replaced runs %s; they finish, then the new runs go",
            ", ".join(task_ids), extra={"action": "replace"},
        )
    else:
        logger.info(
            "revoked with terminate the replaced runs %s", ", ".join(task_ids),
            extra={"action": "replace"},
        )


def _flush(flush: Callable[[], None], runs: list[ClaimedRun]) -> None:
    """Send the buffered messages of ``runs``; raise PublishFailed naming them if that fails."""
    try:
        flush()
    except Exception as exc:
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        ids = ", ".join(run.task_id for run in runs)
        raise PublishFailed(f"cannot publish runs {ids}: {exc}{cause}") from exc


def claim_due(
    batch_size: int, using: str = "default", floor: datetime | None = None
) -> list[ClaimedRun]:
    """Lock up to ``batch_size`` due pending runs (SKIP LOCKED) with their tasks and policies,
    due at or after ``floor`` (None: every due run), in the caller's transaction.

    A task whose schedule cannot be loaded (an unknown time zone written by raw SQL, say) leaves
    its runs' ``load_error`` set, and each is recorded failed with that error; the other runs
    are claimed as usual.
    """
    return claimed_runs(*claim_rows(batch_size, using, floor))


def close(run: ClaimedRun, status: str, reason: str, now: datetime, error: str = "") -> None:
    """Set a claimed run's outcome fields: it ends here, without a dispatch."""
    run.status = status
    run.reason = reason
    run.error = error[:ERROR_LIMIT]
    run.finished_at = now
