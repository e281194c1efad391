"""Delivery: dispatched runs no worker started, and lost runs to recover, re-published.

Invariant 9: a run committed ``dispatched`` either executes or ends with a reason. A message can
be lost inside the broker (a restart without persistence, a purge, an eviction) or on a worker
that died before the body started; the ledger still says ``dispatched``. A reconcile pass finds
such runs (``overdue_deliveries``: no worker started them within the delivery deadline since
their last publish) and re-publishes each with its own task id, at most once per deadline and at
most ``SCHEDULING_REPUBLISH_LIMIT`` times; then it closes the run as failed, "not delivered". The
worker guard runs a task id at most once, so a re-publish that meets the first message (a long
queue) only adds a duplicate that is dropped. Runs whose worker died mid-body and whose task
recovers (worker-loss policy ``recover``, found by ``lost.close_lost_executions``) are published
again the same way, back to ``dispatched``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections, transaction

from scheduling import cadences
from scheduling.clock import database_now
from scheduling.conf import conf
from scheduling.exceptions import PublishFailed, RunRejected
from scheduling.ledger.planning import SCHEDULE_RELATED
from scheduling.ledger.writes import ERROR_LIMIT, update_runs
from scheduling.models import Run, TaskPolicy
from scheduling.run_message import Message, build_message
from scheduling.sql import queries

logger = logging.getLogger(__name__)

_FIELDS = ("status", "reason", "error", "finished_at", "republished", "republished_at")


@dataclass(frozen=True)
class Republisher:
    """How a replica publishes again: ``publish(message)`` as in a claim, ``flush()`` after."""

    publish: Callable[[Message], None]
    flush: Callable[[], None] | None = None
    replica_id: str = ""


@dataclass
class Redelivered:
    """What one redelivery pass did: task ids re-published, recovered, and closed.

    ``names`` maps each of those task ids to its periodic task's name; ``reasons`` each closed
    one to its reason (not delivered, worker lost, rejected before dispatch).
    """

    republished: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict, compare=False)
    reasons: dict[str, str] = field(default_factory=dict, compare=False)
    #: Runs taken but left for the next pass: the pass's publishing time ran out (``budget``).
    deferred: int = field(default=0, compare=False)


def delivery_timeout(run: Run) -> timedelta:
    """The run's delivery deadline: its task policy's ``delivery_timeout_seconds``, else the
    global ``SCHEDULING_DELIVERY_TIMEOUT`` (seconds)."""
    policy: TaskPolicy | None = getattr(run.periodic_task, "scheduling_policy", None)
    if policy is not None and policy.delivery_timeout_seconds is not None:
        return timedelta(seconds=policy.delivery_timeout_seconds)
    return timedelta(seconds=conf.delivery_timeout)


def message_expiry(run: Run) -> datetime | None:
    """When the run's first message expired, or expires (aware UTC); None when it never does.

    As Celery sends it: the task's ``expire_seconds`` after the dispatch, else its ``expires``.
    A re-publish keeps that instant, so a run is never kept alive past its own expiry.
    """
    task = run.periodic_task
    if task is None or run.dispatched_at is None:
        return None
    if task.expire_seconds is not None:
        return run.dispatched_at + timedelta(seconds=task.expire_seconds)
    return task.expires


def redeliver(
    republisher: Republisher,
    *,
    recover: list[tuple[int, int]] | None = None,
    batch_size: int = 100,
    using: str = "default",
    budget: float | None = None,
) -> Redelivered:
    """Re-publish overdue dispatched runs and the lost runs to ``recover``; one transaction.

    Overdue: ``dispatched`` and no (re)publish within the run's ``delivery_timeout``, at most
    ``batch_size`` of them per pass, oldest first. ``recover``: (run id, executions) of running
    runs whose worker was lost, taken only if still running with their execution lock free.
    Each is published again with its own task id (``republished`` + 1, ``republished_at`` the
    database clock; a recovered run goes back to ``dispatched``), or, once re-published
    ``SCHEDULING_REPUBLISH_LIMIT`` times, closed as failed: "not delivered" (or "worker lost").
    A run whose message has expired (``message_expiry``) is closed as expired instead; a
    re-published one carries the first message's expiry. A run that cannot be published
    (RunRejected: its task was deleted, an unknown task name, bad arguments) is closed as failed
    with the error. Broker errors propagate as PublishFailed and roll the pass back, so nothing
    is recorded as re-published unless its publish succeeded.

    The transaction is idle on the database while the messages go out, and the server ends a
    scheduler session idle in a transaction for ``cadences.IDLE_IN_TRANSACTION_TIMEOUT``. A
    pass that outlived it would roll back behind messages already sent, and the next pass would
    send them again, without bound (a slow broker: the SQL broker's inserts on a busy machine
    took over 3 s for 100 runs, and 20 copies of a run piled up). So publishing stops once
    ``budget`` seconds (default: half that timeout) have passed since the last statement, after
    at least one run; the runs left are not written (``deferred``) and wait for the next pass.
    """
    done = Redelivered()
    budget = cadences.IDLE_IN_TRANSACTION_TIMEOUT / 2 if budget is None else budget
    with transaction.atomic(using=using):
        ids = _lock_due(recover or [], batch_size, using)
        if not ids:
            return done
        runs = Run.objects.using(using).select_related(
            *SCHEDULE_RELATED, "periodic_task__scheduling_policy"
        ).in_bulk(ids)
        now = database_now(using)
        started = time.monotonic()
        sent: list[Run] = []
        taken: list[int] = []
        for pk in ids:
            if sent and time.monotonic() - started >= budget:
                break
            taken.append(pk)
            if _redeliver_one(runs[pk], republisher, now, done):
                sent.append(runs[pk])
        if sent and republisher.flush is not None:
            _flush(republisher.flush, sent)
        update_runs([runs[pk] for pk in taken], _FIELDS, using)
        _append_events(sent, now, using)
    done.deferred = len(ids) - len(taken)
    for run in (runs[pk] for pk in taken):
        done.names[run.task_id] = run.periodic_task_name
        if run.task_id in done.closed:
            done.reasons[run.task_id] = run.reason
    _log(done, runs, republisher.replica_id)
    return done


def _flush(flush: Callable[[], None], sent: list[Run]) -> None:
    """Send what the republisher holds; raise PublishFailed naming ``sent`` if that fails."""
    try:
        flush()
    except Exception as exc:
        names = ", ".join(run.task_id for run in sent)
        raise PublishFailed(f"cannot re-publish runs {names}: {exc}") from exc


def _append_events(sent: list[Run], now: datetime, using: str) -> None:
    """Append a ``republished`` or ``recovered`` event (its reason) to each run ``sent``."""
    if not sent:
        return
    kinds = ["recovered" if run.reason == Run.Reason.RECOVERED else "republished" for run in sent]
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["append_run_events"],
            [now, [run.pk for run in sent], kinds, [run.reason for run in sent]],
        )


def _lock_due(recover: list[tuple[int, int]], batch_size: int, using: str) -> list[int]:
    """Lock the overdue dispatched runs and the lost runs still to recover; return their ids."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            queries["overdue_deliveries"], {"timeout": conf.delivery_timeout, "limit": batch_size}
        )
        ids = [pk for (pk,) in cursor.fetchall()]
        if recover:
            cursor.execute(
                queries["lost_to_recover"], [[pk for pk, _ in recover], [n for _, n in recover]]
            )
            ids += [pk for (pk,) in cursor.fetchall()]
    return ids


def _redeliver_one(run: Run, republisher: Republisher, now: datetime, done: Redelivered) -> bool:
    """Publish ``run`` again, or close it; set its fields and note it in ``done``.

    Returns whether a message was published (to be flushed). Raises PublishFailed for a broker
    error.
    """
    limit = conf.republish_limit
    recovering = run.status == Run.Status.RUNNING
    expiry = message_expiry(run)
    if run.republished >= limit:
        _close(run, recovering, limit, now)
    elif expiry is not None and expiry <= now:
        run.status, run.reason = Run.Status.EXPIRED, Run.Reason.MESSAGE_EXPIRED
        run.error = f"its message expired at {expiry.isoformat()}: not published again"
        run.finished_at = now
    else:
        try:
            if run.periodic_task is None:
                raise RunRejected("its periodic task was deleted: the message cannot be rebuilt")
            message = build_message(run, run.periodic_task)
            if expiry is not None:  # the first message's expiry, not a new one
                message.options["expires"] = expiry
            republisher.publish(message)
        except RunRejected as exc:
            run.status, run.reason = Run.Status.FAILED, Run.Reason.REJECTED
            run.error, run.finished_at = str(exc)[:ERROR_LIMIT], now
        except PublishFailed:
            raise
        except Exception as exc:
            raise PublishFailed(f"cannot re-publish run {run.task_id}: {exc}") from exc
        else:
            run.republished += 1
            run.republished_at = now
            if recovering:
                run.status, run.reason = Run.Status.DISPATCHED, Run.Reason.RECOVERED
                done.recovered.append(run.task_id)
            else:
                run.reason = Run.Reason.republished(run.republished, limit, delivery_timeout(run))
                done.republished.append(run.task_id)
            return True
    done.closed.append(run.task_id)
    return False


def _close(run: Run, recovering: bool, limit: int, now: datetime) -> None:
    run.status, run.finished_at = Run.Status.FAILED, now
    if recovering:
        run.reason = Run.Reason.WORKER_LOST
        run.error = f"the worker running it died mid-run again after {limit} re-publishes; no more"
    else:
        timeout = delivery_timeout(run).total_seconds()
        run.reason = Run.Reason.NOT_DELIVERED
        run.error = (
            f"no worker started it within {timeout:g} s of its dispatch nor of any of its "
            f"{limit} re-publishes"
        )


def _log(done: Redelivered, runs: dict[int, Run], replica_id: str) -> None:
    by_task_id = {run.task_id: run for run in runs.values()}
    extra = {"replica": replica_id}
    if done.deferred:
        logger.info(
            "re-publishing took its time budget: %d runs left for the next pass", done.deferred,
            extra={"action": "republish_deferred", **extra},
        )
    for task_id in done.republished:
        run = by_task_id[task_id]
        logger.warning(
            "re-published run %s of %r (%d of %d): no worker started it within %g s",
            task_id, run.periodic_task_name, run.republished, conf.republish_limit,
            delivery_timeout(run).total_seconds(), extra={"action": "republish", **extra},
        )
    for task_id in done.recovered:
        logger.warning(
            "re-published run %s of %r after its worker was lost (worker-loss policy recover)",
            task_id, by_task_id[task_id].periodic_task_name, extra={"action": "recover", **extra},
        )
    for task_id in done.closed:
        run = by_task_id[task_id]
        logger.error(
            "run %s of %r %s: %s (%s)", task_id, run.periodic_task_name, run.status, run.reason,
            run.error, extra={"action": "not_delivered", **extra},
        )
