"""The worker side of a run: its start (with the duplicate guard's verdict) and its outcome.

Called by ``scheduling.guard`` and ``scheduling.worker`` in the worker's processes. Invariant 3:
``begin_execution`` reads the run row, asks ``verdict.verdict`` (the rule, pure) and performs the
writes it names, in one transaction, so a re-publish or a broker redelivery of a task id runs at
most once while the first is running on a live worker or after it finished.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import connections, transaction
from django.db.models import Case, F, IntegerField, OuterRef, Subquery, TextField, Value, When
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.clock import ClockTimestamp, database_now
from scheduling.conf import conf
from scheduling.exceptions import ScheduleError
from scheduling.ledger.changes import note_unplanned
from scheduling.ledger.planning import TASK_RELATED
from scheduling.ledger.verdict import RunFacts, Verdict, Write, verdict
from scheduling.ledger.writes import ERROR_LIMIT, TaskUpdate, insert_pending, update_tasks
from scheduling.models import Run, TaskPolicy
from scheduling.sql import queries

logger = logging.getLogger(__name__)


def record_started(task_id: str, worker: str, using: str = "default") -> bool:
    """Mark the run with ``task_id`` running on ``worker``; return False if no run matched.

    For workers without the guard (``begin_execution`` records the start with its decision).
    Waits for a claim in progress on the row (bounded by the claim transaction). A run still
    pending after that is adopted (``_start``), as the guard's verdict does.
    """
    with transaction.atomic(using=using):
        run = Run.objects.using(using).live().filter(task_id=task_id).select_for_update().first()
        if run is None:
            return False
        _start(run, {"worker": worker[:255]}, using, adopt=run.status == Run.Status.PENDING)
    return True


def _start(run: Run, fields: dict[str, object], using: str, *, adopt: bool) -> None:
    """Mark the locked ``run`` running now, with ``fields``; with ``adopt``, adopt it.

    A run still pending when a worker starts it was published by a replica whose claim then
    rolled back (it died or was stopped before committing): its message is out, so this delivery
    is its dispatch. The run is adopted: recorded as dispatched now, with reason ADOPTED, and the
    task's following slot is planned, as the claim would have done. No replica re-publishes it
    afterwards, since it is no longer pending.
    """
    fields = {"status": Run.Status.RUNNING, "started_at": ClockTimestamp(), **fields}
    if adopt:  # one clock read: started and dispatched at the same instant
        now = database_now(using)
        fields.update(started_at=now, dispatched_at=now, reason=Run.Reason.ADOPTED)
    Run.objects.using(using).filter(pk=run.pk).update(**fields)
    if adopt:  # after the update: a task has one pending scheduled run at a time
        _plan_after_adoption(run, using)


def _plan_after_adoption(run: Run, using: str) -> None:
    """Do what the rolled-back claim would have done after publishing ``run``, and log it."""
    logger.warning(
        "adopted run %s of %r: published by a replica that did not commit its claim",
        run.task_id, run.periodic_task_name, extra={"action": "adopt"},
    )
    if run.periodic_task_id is None or run.trigger != Run.Trigger.SCHEDULE:
        return
    task = (
        PeriodicTask.objects.using(using).select_related(*TASK_RELATED)
        .filter(pk=run.periodic_task_id).first()
    )
    if task is None:
        return
    update = TaskUpdate()
    update.ran(run.scheduled_for)
    if task.one_off:
        update.disable = True
    else:
        try:
            nxt = slots.next_run(task, run.scheduled_for)
        except ScheduleError:
            nxt = None  # the reconcile pass records the schedule's error
            note_unplanned({task.pk}, using)
        else:
            update.disable = nxt is None
        if nxt is not None:
            insert_pending([(task, nxt)], using)
    update_tasks({task.pk: update}, using)


#: The worker-loss policy of a run's task (its policy row's; NULL without one, or "" when the
#: row leaves it to the setting). A subquery, not a join: the guard's statement runs once per
#: delivery, unprepared, and its eight-table join of the task and its schedules (needed only to
#: adopt a run) took 10 to 80 ms to plan for 1 ms of execution (bench/guard_cost.py).
_WORKER_LOST = Subquery(
    TaskPolicy.objects.filter(periodic_task_id=OuterRef("periodic_task_id"))
    .values("worker_lost_policy")[:1]
)


#: A scheduled run's slot, as its message names it: (periodic task name, aware UTC slot).
Slot = tuple[str, datetime]


def begin_execution(
    task_id: str,
    worker: str,
    *,
    retries: int,
    redelivered: bool,
    exclusive: bool,
    slot: Slot | None = None,
    using: str = "default",
) -> Verdict:
    """Decide, in one transaction on the run row, what happens to this delivery of ``task_id``.

    Reads the run with this task id (locked FOR UPDATE, waiting for a claim in progress on it),
    asks ``verdict.verdict`` (its table: docs/guard.md) and performs on the run the writes the
    verdict names (``verdict.Write``); returns the verdict. ``retries`` is Celery's
    ``request.retries`` of the delivery, ``redelivered`` the broker's flag
    (``delivery_info["redelivered"]``), and ``exclusive`` whether the caller got the run's
    execution lock for this attempt (``scheduling.guard``: a PostgreSQL advisory lock held by the
    executing process's own session for as long as the body runs, so the server frees it when that
    process dies). ``slot`` is the message's periodic task name and slot: for a delivery without
    a run, whether the ledger has not planned it yet is read (``_not_planned_yet``). Database
    errors propagate (the guard requeues).
    """
    with transaction.atomic(using=using):
        run = _locked_run(task_id, using)
        facts = None if run is None else RunFacts(
            run.status, run.reason, run.executions, run.retries,
            run.worker_lost or conf.worker_lost_policy,  # type: ignore[attr-defined]
        )
        ahead = run is None and slot is not None and _not_planned_yet(task_id, slot, using)
        found = verdict(
            facts, retries=retries, redelivered=redelivered, exclusive=exclusive,
            ahead_of_ledger=ahead,
        )
        if run is not None:
            _write(run, found, worker, retries, using)
    return found


def _locked_run(task_id: str, using: str) -> Run | None:
    """The run of ``task_id``, locked FOR UPDATE, with its task's worker-loss policy
    (``worker_lost``): a live run first, a cancelled one only when no other has this task id."""
    return (
        Run.objects.using(using)
        .filter(task_id=task_id)
        .annotate(worker_lost=_WORKER_LOST)
        .select_for_update()
        .order_by(
            Case(
                When(status=Run.Status.CANCELLED, then=1),
                default=0,
                output_field=IntegerField(),
            ),
            "-pk",
        )
        .first()
    )


def _write(run: Run, found: Verdict, worker: str, retries: int, using: str) -> None:
    """Perform on the locked ``run`` the writes that ``found`` names, and nothing else."""
    writes = found.writes
    fields: dict[str, object] = {}
    if Write.START in writes:
        fields.update(worker=worker[:255], retries=retries, executions=F("executions") + 1)
    if Write.REASON in writes:
        fields["reason"] = found.reason
    if Write.REOPEN in writes:
        fields.update(error="", finished_at=None)
    if Write.SUPPRESSED in writes:
        fields["suppressed"] = F("suppressed") + 1
    if Write.CLOSE in writes:
        fields.update(
            status=Run.Status.FAILED, reason=Run.Reason.WORKER_LOST,
            finished_at=ClockTimestamp(), error=_REDELIVERED_NOT_RUN,
        )
    if Write.NOTE in writes and _REDELIVERED_LATER not in run.error:
        fields["error"] = (run.error + _REDELIVERED_LATER)[:ERROR_LIMIT]
    if Write.START in writes:
        _start(run, fields, using, adopt=Write.ADOPT in writes)
    elif fields:
        Run.objects.using(using).filter(pk=run.pk).update(**fields)


def _not_planned_yet(task_id: str, slot: Slot, using: str) -> bool:
    """Whether ``task_id`` is the run of a scheduled slot the ledger has not reached yet.

    After a failover with asynchronous replication the promoted standby may lack the last runs
    of the old primary, whose messages are in the broker. The replicas plan those slots again
    (from the task's latest run, slot by slot, with the same deterministic task ids), and a
    delivery that waits for that is run once, by the guard's usual rule; one that ran now,
    untracked, would run again once the slot is dispatched. True when the periodic task named in
    the message exists and is enabled, ``task_id`` is its slot's scheduled-run id
    (``slots.task_id_for``: not a manual run or a backfill), and no scheduled run of the task is
    at or after the slot. Two indexed reads, only for a delivery without a run.
    """
    name, scheduled_for = slot
    task = PeriodicTask.objects.using(using).filter(name=name, enabled=True).only("pk").first()
    if task is None or slots.task_id_for(task.pk, scheduled_for) != task_id:
        return False
    return not Run.objects.using(using).filter(
        periodic_task_id=task.pk, trigger=Run.Trigger.SCHEDULE, scheduled_for__gte=scheduled_for
    ).exists()


#: Error of a run closed by the guard: its worker died and the broker redelivered it (policy fail).
_REDELIVERED_NOT_RUN = (
    "the worker running it died mid-run; the broker redelivered its message and it was not run "
    "again (worker-loss policy fail)"
)
#: Added to the error of a run closed "worker lost" when its message is redelivered afterwards.
_REDELIVERED_LATER = "; the broker redelivered its message afterwards and it was not run"


def record_finished(
    task_id: str,
    status: str,
    error: str = "",
    *,
    retries: int | None = None,
    using: str = "default",
) -> bool:
    """Record the final ``status`` (succeeded or failed) and a short error text on the run.

    With ``retries`` (the finishing attempt's ``request.retries``), only that attempt's outcome is
    recorded, so a late signal of an earlier attempt cannot overwrite a later one. A run closed as
    "worker lost" takes the outcome of its attempt if that attempt did finish after all.
    """
    runs = (
        Run.objects.using(using)
        .filter(task_id=task_id)
        .exclude(status__in=(Run.Status.CANCELLED, Run.Status.PENDING, *Run.FINAL_STATUSES))
        # the worker was only thought lost (its lock session ended, it did not): the real outcome
        | Run.objects.using(using).filter(
            task_id=task_id, status=Run.Status.FAILED, reason=Run.Reason.WORKER_LOST
        )
    )
    if retries is not None:
        runs = runs.filter(retries=retries)
    reason = Case(
        When(reason=Run.Reason.WORKER_LOST, then=Value(Run.Reason.LATE_OUTCOME)),
        default=F("reason"),
        output_field=TextField(),
    )
    return bool(
        runs.update(
            status=status, finished_at=ClockTimestamp(), error=error[:ERROR_LIMIT], reason=reason
        )
    )


def record_retry(
    task_id: str, error: str = "", *, retries: int | None = None, using: str = "default"
) -> bool:
    """Mark the run retrying (a Celery retry of the same run is on its way).

    ``retries`` is the retrying attempt's ``request.retries``: when the next attempt already
    started (its message can overtake this signal), the run is left running. A retry event is
    appended to the run's ``events`` with the attempt's start and worker (its page's timeline
    shows each attempt's start and each retry); its detail counts attempts from 1.
    """
    error = error[:ERROR_LIMIT]
    attempt = f"attempt {retries + 1}" if retries is not None else "an attempt"  # 1: the first
    detail = f"{attempt} failed and is retried: {error}" if error else f"{attempt} is retried"
    params = {"error": error, "detail": detail, "task_id": task_id, "retries": retries}
    with connections[using].cursor() as cursor:
        cursor.execute(queries["record_retry"], params)
        return cursor.fetchone() is not None


def record_not_executed(task_id: str, status: str, reason: str, error: str = "",
                        using: str = "default") -> bool:
    """Close a run whose message a worker dropped before executing it; return True if one was.

    Used for an expired message (``status`` expired), a revoked one and a task name the worker
    does not know (failed). Only a run not executing is closed (pending, dispatched, or
    retrying: its next attempt's message was dropped, by a revoke of overlap policy replace
    say): a duplicate message dropped while the run executes elsewhere leaves it alone.
    """
    waiting = (Run.Status.PENDING, Run.Status.DISPATCHED, Run.Status.RETRYING)
    kept = Case(  # a run overlap policy replace revoked says so
        When(reason__startswith=Run.Reason.REPLACED, then=F("reason")),
        default=Value(reason), output_field=TextField(),
    )
    return bool(
        Run.objects.using(using)
        .filter(task_id=task_id, status__in=waiting)
        .update(
            status=status, reason=kept, error=error[:ERROR_LIMIT], finished_at=ClockTimestamp()
        )
    )
