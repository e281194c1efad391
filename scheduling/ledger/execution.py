"""The worker side of a run: its start (with the duplicate guard's decision) and its outcome.

Called by ``scheduling.guard`` and ``scheduling.worker`` in the worker's processes. Invariant 3:
``begin_execution`` decides in one transaction on the run row whether a delivery executes, so a
re-publish or a broker redelivery of a task id runs at most once while the first is running on a
live worker or after it finished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
from scheduling.ledger.writes import ERROR_LIMIT, TaskUpdate, insert_pending, update_tasks
from scheduling.models import Run, TaskPolicy
from scheduling.sql import queries

logger = logging.getLogger(__name__)


def record_started(task_id: str, worker: str, using: str = "default") -> bool:
    """Mark the run with ``task_id`` running on ``worker``; return False if no run matched.

    For workers without the guard (``begin_execution`` records the start with its decision).
    Waits for a claim in progress on the row (bounded by the claim transaction). A run still
    pending after that is adopted (``_start``).
    """
    with transaction.atomic(using=using):
        run = Run.objects.using(using).live().filter(task_id=task_id).select_for_update().first()
        if run is None:
            return False
        _start(run, {"worker": worker[:255]}, using)
    return True


def _start(run: Run, fields: dict[str, object], using: str) -> None:
    """Mark the locked ``run`` running now, with ``fields``; adopt it if it is still pending.

    A run still pending when a worker starts it was published by a replica whose claim then
    rolled back (it died or was stopped before committing): its message is out, so this delivery
    is its dispatch. The run is adopted: recorded as dispatched now, with reason ADOPTED, and the
    task's following slot is planned, as the claim would have done. No replica re-publishes it
    afterwards, since it is no longer pending.
    """
    fields = {"status": Run.Status.RUNNING, "started_at": ClockTimestamp(), **fields}
    adopted = run.status == Run.Status.PENDING
    if adopted:  # one clock read: started and dispatched at the same instant
        now = database_now(using)
        fields.update(started_at=now, dispatched_at=now, reason=Run.Reason.ADOPTED)
    Run.objects.using(using).filter(pk=run.pk).update(**fields)
    if adopted:  # after the update: a task has one pending scheduled run at a time
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


@dataclass(frozen=True)
class Execution:
    """The guard's decision for one delivery: run the task body or drop the delivery.

    ``tracked`` is False when no run has this task id (the body runs, nothing is recorded).
    ``requeue`` is True when the delivery should go back to the broker and come again (its run
    is not in the ledger yet: ``_not_planned_yet``). ``reason`` says why (logged, and kept on the
    run for re-executions).
    """

    execute: bool
    tracked: bool
    reason: str
    run_id: int | None = None
    requeue: bool = False


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
) -> Execution:
    """Decide, in one transaction on the run row, whether this delivery of ``task_id`` executes.

    ``retries`` is Celery's ``request.retries`` of the delivery, ``redelivered`` the broker's flag
    (``delivery_info["redelivered"]``), and ``exclusive`` whether the caller got the run's
    execution lock for this attempt (``scheduling.guard``: a PostgreSQL advisory lock held by the
    executing process's own session for as long as the body runs, so the server frees it when that
    process dies). The rule, run by run status:

    - pending (published by a replica whose claim rolled back): adopted, executes;
    - dispatched: executes (the first delivery);
    - running: a later Celery retry (``retries`` above the run's) executes; the same attempt
      redelivered by the broker with the execution lock free (its holder's database session has
      ended: its worker died mid-body) executes again under worker-loss policy ``recover``, and
      under ``fail`` is dropped and the run closed as failed, "worker lost", saying so. Otherwise
      it is a duplicate of an execution on a live worker and is dropped;
    - retrying: only the next attempt (``retries`` above the run's) executes;
    - failed "not delivered" with no execution (the deadline closed it, then its message arrived
      after all): executes, nothing of it ran;
    - succeeded, failed, expired, skipped, missed, cancelled: dropped (finished). A redelivery
      of a run closed "worker lost" is noted in its error;
    - no run: requeued when ``slot`` (the message's periodic task name and slot) is a scheduled
      slot the ledger has not reached yet (``_not_planned_yet``: a ledger behind its messages,
      after an asynchronous failover); otherwise executed untracked.

    Without ``exclusive`` nothing executes: a live process holds this attempt's lock. An executing
    delivery sets running, ``started_at``, ``worker``, ``retries`` and adds one to ``executions``;
    a dropped one adds one to ``suppressed``. Database errors propagate (the guard requeues).
    """
    with transaction.atomic(using=using):
        run = _locked_run(task_id, using)
        if run is None:
            if slot is not None and _not_planned_yet(task_id, slot, using):
                return Execution(False, False, _NOT_PLANNED_YET, requeue=True)
            return Execution(True, False, "no run has this task id")
        recover = run.worker_lost or conf.worker_lost_policy  # type: ignore[attr-defined]
        reason = _execution_verdict(run, retries, redelivered, exclusive, recover)
        if reason is None:
            _drop(run, redelivered, exclusive, using)
            return Execution(False, True, _suppressed_reason(run, exclusive), run.pk)
        fields: dict[str, object] = {
            "worker": worker[:255],
            "retries": retries,
            "executions": F("executions") + 1,
        }
        if run.status == Run.Status.RUNNING and retries == run.retries:
            fields["reason"] = reason
        elif run.status == Run.Status.FAILED:  # a late delivery of a run closed "not delivered"
            fields.update(reason=reason, error="", finished_at=None)
        _start(run, fields, using)
    return Execution(True, True, reason, run.pk)


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


def _drop(run: Run, redelivered: bool, exclusive: bool, using: str) -> None:
    """Count a dropped delivery on ``run``; a redelivery after its worker died closes it (policy
    fail), and one of a run already closed "worker lost" is noted in its error."""
    dropped: dict[str, object] = {"suppressed": F("suppressed") + 1}
    if exclusive and redelivered and run.status == Run.Status.RUNNING:
        dropped.update(  # worker-loss policy fail: the crash ends the run here
            status=Run.Status.FAILED, reason=Run.Reason.WORKER_LOST,
            finished_at=ClockTimestamp(), error=_REDELIVERED_NOT_RUN,
        )
    elif (
        redelivered
        and run.reason == Run.Reason.WORKER_LOST
        and _REDELIVERED_LATER not in run.error
    ):
        dropped["error"] = (run.error + _REDELIVERED_LATER)[:ERROR_LIMIT]
    Run.objects.using(using).filter(pk=run.pk).update(**dropped)


_NOT_PLANNED_YET = (
    "its slot is past the task's latest run: the ledger is behind its messages (a failover lost "
    "its tail?) until a replica plans the slot again"
)


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


def _execution_verdict(
    run: Run, retries: int, redelivered: bool, exclusive: bool, worker_lost: str
) -> str | None:
    """Return why this delivery executes, or None to drop it (rule in ``begin_execution``)."""
    if not exclusive:
        return None
    status = run.status
    if status == Run.Status.PENDING:
        return Run.Reason.ADOPTED
    if status == Run.Status.DISPATCHED:
        return Run.Reason.FIRST_DELIVERY
    if status in (Run.Status.RUNNING, Run.Status.RETRYING) and retries > run.retries:
        return Run.Reason.celery_retry(retries)
    if status == Run.Status.RUNNING and retries == run.retries and redelivered:
        return Run.Reason.REEXECUTED if worker_lost == TaskPolicy.WorkerLost.RECOVER else None
    if status == Run.Status.FAILED and run.reason == Run.Reason.NOT_DELIVERED and not run.executions:
        return Run.Reason.LATE_DELIVERY
    return None


def _suppressed_reason(run: Run, exclusive: bool) -> str:
    if not exclusive:
        return "running on a live worker"
    if run.status in Run.FINAL_STATUSES:
        return f"already {run.status}"
    return f"duplicate of a {run.status} run (attempt {run.retries})"


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
    return bool(
        Run.objects.using(using)
        .filter(task_id=task_id, status__in=waiting)
        .update(
            status=status, reason=reason, error=error[:ERROR_LIMIT], finished_at=ClockTimestamp()
        )
    )
