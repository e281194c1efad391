"""Worker side: record each run's start, retries and outcome on its ledger row, by task id.

Connected in ``SchedulingConfig.ready()``. The decision whether a delivery executes at all is the
guard's (``scheduling.guard``, installed by the task annotation in the Celery configuration); these
handlers record what happened:

- ``task_success`` / ``task_failure``: succeeded / failed (the latter also for a pool process lost
  mid-task, ``WorkerLostError``, which Celery reports from the worker's main process);
- ``task_retry``: retrying (the next attempt, ``request.retries + 1``, executes);
- ``task_postrun``: releases the execution lock the guard took;
- ``task_revoked``: expired when the message's ``expires`` passed before a worker took it, failed
  for any other revoke;
- ``task_unknown`` / ``task_rejected``: failed with a clear error when the worker does not know
  the task name or cannot read the message;
- ``worker_ready``: one ERROR when the database's migrations do not match this worker's code
  (``migration_match``; the guard holds the scheduled runs meanwhile).

After each outcome is committed, ``scheduling.signals.run_finished`` is sent
(``announce_finished``: no query unless a receiver is connected, such as the webhook).

Tasks not sent by the scheduler (no ``scheduling_run`` header) return at the first check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from celery import signals
from django.db import InterfaceError, OperationalError, connection

from scheduling import cadences, guard, ledger
from scheduling.backoff import retry_delay
from scheduling.conf import conf
from scheduling.database_reach import database
from scheduling.migration_match import MigrationWait
from scheduling.models import Run
from scheduling.run_message import HEADER_RUN
from scheduling.signals import announce_finished

logger = logging.getLogger(__name__)

#: Errors of a lost connection on the guard's own session (``guard.liveness``), retried as
#: Django's are.
_SESSION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def record(
    write: Callable[..., bool], *args: Any, patience: float | None = None, **kwargs: Any
) -> bool:
    """Run one ledger write; while the connection fails, reconnect and retry, bounded.

    Celery swallows exceptions from signal handlers, so a write lost to a terminated connection,
    a database outage or a network partition would leave the run stuck (``running``, then closed
    "worker lost" by the replicas although it finished). The first retry is at once (a
    connection the server terminated); then with the replicas' doubling backoff
    (``backoff.retry_delay``, capped at ``cadences.RETRY_BACKOFF_MAX``) until ``patience``
    seconds have passed, by default ``SCHEDULING_WORKER_LOST_AFTER`` (the time the lost-worker
    sweep leaves a run whose execution lock is free), so a worker cut off or failed over for less
    than that records its outcome when the database is back. Each reconnection tries every server
    of the settings (after a failover, the promoted standby); each attempt on a cut-off network
    ends within the connection's bounds (``tcp_user_timeout``, ``connect_timeout``:
    docs/outages.md, "Network partitions"). The worker holds the message meanwhile
    (``acks_late``). The outage is logged once each way (``scheduling.database_reach``); a write
    given up is
    logged with its traceback. Returns ``write``'s result, False when given up.
    """
    deadline = time.monotonic() + (conf.worker_lost_after if patience is None else patience)
    failures = 0
    while True:
        try:
            done = write(*args, **kwargs)
        except (OperationalError, InterfaceError, *_SESSION_ERRORS) as exc:
            connection.close()  # a write on the guard's own session has closed it already
            failures += 1
            if failures > 1:
                database.lost(exc)
            wait = 0.0 if failures == 1 else retry_delay(failures - 1, cadences.RETRY_BACKOFF_MAX)
            if time.monotonic() + wait > deadline:
                logger.exception(
                    "cannot record %s for run %s", write.__name__, args[0] if args else "?",
                    extra={"action": "record_failed"},
                )
                return False
            time.sleep(wait)
            continue
        database.reached(session=guard.liveness.address())
        return done


@signals.worker_ready.connect(dispatch_uid="scheduling.worker_ready")
def _on_ready(sender: Any = None, **_: Any) -> None:
    hostname = getattr(sender, "hostname", "") or ""
    MigrationWait(
        f"worker {hostname}".strip(),
        "holds the scheduled runs it takes until the migrations match its code",
    ).behind_or_unknown()  # an unreachable database: the guard's outage path says so
    connection.close()  # the main process runs no task


def _is_scheduled(task: Any) -> bool:
    request = getattr(task, "request", None)
    return request is not None and request.get(HEADER_RUN) is not None


def _retries(task: Any) -> int | None:
    value = task.request.get("retries")
    return None if value is None else int(value)


def _short(exc: BaseException | None) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {exc}"


@signals.task_prerun.connect(dispatch_uid="scheduling.task_prerun")
def _on_prerun(sender: Any = None, task_id: str = "", task: Any = None, **_: Any) -> None:
    # With the guard installed, it records the start (atomically with its decision).
    if _is_scheduled(task) and not guard.is_guarded(task):
        record(ledger.record_started, task_id, task.request.hostname or "")


@signals.task_postrun.connect(dispatch_uid="scheduling.task_postrun")
def _on_postrun(sender: Any = None, task: Any = None, **_: Any) -> None:
    key = getattr(getattr(task, "request", None), guard.LOCK_ATTRIBUTE, None)
    if key is not None:
        guard.liveness.unlock(key)


def _finished(task: Any, task_id: str, status: str, error: str = "") -> None:
    """Record a scheduled run's outcome: a guarded attempt's with its lock's release, in one
    statement on the process's own session (``guard.liveness.finish``); any other on Django's
    connection (``ledger.record_finished``)."""
    request = task.request
    key = getattr(request, guard.LOCK_ATTRIBUTE, None)
    if key is not None:
        setattr(request, guard.LOCK_ATTRIBUTE, None)  # released here: nothing at task_postrun
        done = record(guard.liveness.finish, key, status, error)
    else:
        done = record(ledger.record_finished, task_id, status, error, retries=_retries(task))
    if done:
        announce_finished(task_id)


@signals.task_success.connect(dispatch_uid="scheduling.task_success")
def _on_success(sender: Any = None, **_: Any) -> None:
    if _is_scheduled(sender):
        _finished(sender, sender.request.id, Run.Status.SUCCEEDED)


@signals.task_failure.connect(dispatch_uid="scheduling.task_failure")
def _on_failure(
    sender: Any = None, task_id: str = "", exception: BaseException | None = None, **_: Any
) -> None:
    if _is_scheduled(sender):
        _finished(sender, task_id, Run.Status.FAILED, _short(exception))


@signals.task_retry.connect(dispatch_uid="scheduling.task_retry")
def _on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    if request is not None and request.get(HEADER_RUN) is not None:
        retries = request.get("retries")
        record(ledger.record_retry,
            request.id, str(reason or ""), retries=None if retries is None else int(retries)
        )


@signals.task_revoked.connect(dispatch_uid="scheduling.task_revoked")
def _on_revoked(
    sender: Any = None, request: Any = None, expired: bool = False, terminated: bool = False,
    **_: Any,
) -> None:
    if request is None or request.get(HEADER_RUN) is None:
        return
    if expired:
        closed = record(ledger.record_not_executed,
            request.id, Run.Status.EXPIRED, Run.Reason.MESSAGE_EXPIRED
        )
    else:
        error = "revoked (terminated)" if terminated else "revoked"
        closed = record(
            ledger.record_not_executed, request.id, Run.Status.FAILED, Run.Reason.REVOKED, error
        ) or (terminated and record(ledger.record_finished, request.id, Run.Status.FAILED, error))
    if closed:
        announce_finished(request.id)
        logger.warning(
            "run %s %s", request.id, "expired" if expired else "revoked",
            extra={"action": "expired" if expired else "revoked"},
        )


def _message_run(message: Any) -> tuple[str, str] | None:
    headers = getattr(message, "headers", None) or {}
    if headers.get(HEADER_RUN) is None or not headers.get("id"):
        return None
    return str(headers["id"]), str(headers.get("task") or "")


@signals.task_unknown.connect(dispatch_uid="scheduling.task_unknown")
def _on_unknown(sender: Any = None, message: Any = None, name: str = "", **_: Any) -> None:
    found = _message_run(message)
    if found is None:
        return
    task_id, _name = found
    hostname = getattr(sender, "hostname", "") or ""
    error = f"unknown task name {name!r}: not registered on worker {hostname}"
    if record(
        ledger.record_not_executed, task_id, Run.Status.FAILED, Run.Reason.UNKNOWN_TASK, error
    ):
        announce_finished(task_id)
        logger.error("run %s failed: %s", task_id, error, extra={"action": "unknown_task"})


@signals.task_rejected.connect(dispatch_uid="scheduling.task_rejected")
def _on_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    found = _message_run(message)
    if found is None:
        return
    task_id, name = found
    error = f"message of task {name!r} rejected by the worker: {_short(exc) or 'unknown format'}"
    if record(
        ledger.record_not_executed, task_id, Run.Status.FAILED, Run.Reason.REJECTED_BY_WORKER,
        error,
    ):
        announce_finished(task_id)
        logger.error("run %s failed: %s", task_id, error, extra={"action": "rejected"})
