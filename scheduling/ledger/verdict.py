"""The worker guard's verdict on one delivery of a scheduled run, as a value: ``verdict``.

``verdict`` is pure: it reads the run's facts (a ``RunFacts``, or None when no run has the task
id), the delivery's attempt and the broker's ``redelivered`` flag, whether this process got the
attempt's execution lock, and, for a delivery without a run, whether its slot is ahead of the
ledger (a query's answer, asked by the caller). It returns a ``Verdict``: the ``Case`` that
decided (what happens to the delivery, ``Outcome``, and which writes to the run follow,
``Write``) and the reason. It reads no database and writes nothing: ``execution.begin_execution``
reads the run row, asks it and performs the writes; the guard acts on the outcome.

``CASES`` is the function's table, in the order the cases are tried; docs/guard.md shows it, one
row a case (tests/unit/test_verdict.py holds the two equal). The guard's one-statement start (the
SQL function ``scheduling_start_execution``) performs one case alone, ``FIRST_DELIVERY``: the lock
free, the run dispatched, the write ``START`` (tests/integration/test_guard_start.py).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from scheduling.models import Run, TaskPolicy


class Outcome(enum.StrEnum):
    """What the guard does with the delivery (the words of the table's Result column)."""

    #: The task body runs.
    EXECUTE = "executes"
    #: The task body runs; no run records it.
    UNTRACKED = "executes untracked"
    #: The body does not run (``Ignore``).
    SUPPRESS = "suppressed"
    #: The body does not run, and the run is closed failed, "worker lost".
    CLOSE = "suppressed, run closed"
    #: The message goes back to the broker (``Reject(requeue=True)``) and comes again.
    REQUEUE = "requeued"


class Write(enum.StrEnum):
    """A write to the run that follows a verdict (the words of the table's last column)."""

    #: Running, ``started_at`` now, ``worker``, the delivery's attempt as ``retries``, one
    #: execution more.
    START = "started"
    #: ``dispatched_at`` and ``started_at`` the database clock now, the reason the case's; a
    #: scheduled run's task gets its following slot planned, as the claim that rolled back would
    #: have done.
    ADOPT = "adopted"
    #: The run's ``reason`` becomes the verdict's.
    REASON = "reason"
    #: ``error`` emptied and ``finished_at`` cleared: a closed run starts after all.
    REOPEN = "reopened"
    #: ``suppressed`` goes up by one.
    SUPPRESSED = "suppressed +1"
    #: Failed, reason "worker lost", finished now, the error saying the broker redelivered it.
    CLOSE = "closed"
    #: The error says, once, that the broker redelivered the message afterwards.
    NOTE = "noted"


class Case(NamedTuple):
    """One row of the verdict's table: its name, what happens, and the writes that follow."""

    name: str
    outcome: Outcome
    writes: tuple[Write, ...] = ()


AHEAD_OF_LEDGER = Case("slot ahead of the ledger", Outcome.REQUEUE)
NO_RUN = Case("no run", Outcome.UNTRACKED)
LOCK_HELD = Case("lock held", Outcome.SUPPRESS, (Write.SUPPRESSED,))
ADOPTED = Case("adopted", Outcome.EXECUTE, (Write.START, Write.ADOPT))
FIRST_DELIVERY = Case("first delivery", Outcome.EXECUTE, (Write.START,))
CELERY_RETRY = Case("Celery retry", Outcome.EXECUTE, (Write.START,))
WORKER_DIED_RECOVER = Case("worker died, recover", Outcome.EXECUTE, (Write.START, Write.REASON))
WORKER_DIED_FAIL = Case("worker died, fail", Outcome.CLOSE, (Write.SUPPRESSED, Write.CLOSE))
LATE_DELIVERY = Case("late delivery", Outcome.EXECUTE, (Write.START, Write.REASON, Write.REOPEN))
LOST_REDELIVERED = Case(
    "redelivered after worker lost", Outcome.SUPPRESS, (Write.SUPPRESSED, Write.NOTE)
)
FINISHED = Case("finished", Outcome.SUPPRESS, (Write.SUPPRESSED,))
DUPLICATE = Case("duplicate", Outcome.SUPPRESS, (Write.SUPPRESSED,))

#: The verdict's table: every case, in the order ``verdict`` tries them (the first that matches
#: a delivery decides it).
CASES = (
    AHEAD_OF_LEDGER, NO_RUN, LOCK_HELD, ADOPTED, FIRST_DELIVERY, CELERY_RETRY,
    WORKER_DIED_RECOVER, WORKER_DIED_FAIL, LATE_DELIVERY, LOST_REDELIVERED, FINISHED, DUPLICATE,
)

#: The reason of a delivery requeued because its run is not in the ledger yet.
NOT_PLANNED_YET = (
    "its slot is past the task's latest run: the ledger is behind its messages (a failover lost "
    "its tail?) until a replica plans the slot again"
)
#: The reason of a delivery without a run.
UNTRACKED = "no run has this task id"
#: The reason of a delivery whose attempt's execution lock another session holds.
LIVE_ELSEWHERE = "running on a live worker"


class RunFacts(NamedTuple):
    """What the verdict reads of the run that has the delivery's task id."""

    #: ``Run.status``.
    status: str
    #: ``Run.reason``.
    reason: str
    #: ``Run.executions``: how many deliveries the guard started (a count).
    executions: int
    #: ``Run.retries``: the attempt the run is at (Celery's ``request.retries``, from 0).
    attempt: int
    #: The task's worker-loss policy, resolved: ``TaskPolicy.WorkerLost`` "fail" or "recover".
    worker_lost_policy: str


class Verdict(NamedTuple):
    """The guard's verdict on one delivery: the case that decided it and why."""

    case: Case
    #: Logged, given to ``Ignore``, and kept on the run when the case writes ``Write.REASON``.
    reason: str

    @property
    def outcome(self) -> Outcome:
        """What the guard does with the delivery."""
        return self.case.outcome

    @property
    def writes(self) -> tuple[Write, ...]:
        """The writes to the run that follow, in the order of the table (none without a run)."""
        return self.case.writes

    @property
    def execute(self) -> bool:
        """Whether the task body runs (tracked or not)."""
        return self.case.outcome in (Outcome.EXECUTE, Outcome.UNTRACKED)


def verdict(
    run: RunFacts | None, *, retries: int, redelivered: bool, exclusive: bool,
    ahead_of_ledger: bool,
) -> Verdict:
    """Decide what happens to one delivery of a scheduled run: the first case of ``CASES`` that
    matches it.

    ``run`` is the run with the delivery's task id, None when there is none; ``retries`` the
    delivery's attempt (Celery's ``request.retries``, from 0); ``redelivered`` the broker's flag
    (``delivery_info["redelivered"]``: only a redelivery after a consumer was lost sets it);
    ``exclusive`` whether this process took the attempt's execution lock (held by another
    session: the attempt runs on a live process); ``ahead_of_ledger`` whether the message names a
    scheduled slot the ledger has not planned yet (read only when ``run`` is None).
    """
    if run is None:
        if ahead_of_ledger:
            return Verdict(AHEAD_OF_LEDGER, NOT_PLANNED_YET)
        return Verdict(NO_RUN, UNTRACKED)
    status, attempt = run.status, run.attempt
    duplicate = f"duplicate of a {status} run (attempt {attempt})"
    if not exclusive:
        return Verdict(LOCK_HELD, LIVE_ELSEWHERE)
    if status == Run.Status.PENDING:  # published by a replica whose claim rolled back
        return Verdict(ADOPTED, Run.Reason.ADOPTED)
    if status == Run.Status.DISPATCHED:
        return Verdict(FIRST_DELIVERY, Run.Reason.FIRST_DELIVERY)
    if status in (Run.Status.RUNNING, Run.Status.RETRYING) and retries > attempt:
        return Verdict(CELERY_RETRY, Run.Reason.celery_retry(retries))
    if status == Run.Status.RUNNING and retries == attempt and redelivered:
        # the lock was free: the session of the process that ran the attempt has ended
        if run.worker_lost_policy == TaskPolicy.WorkerLost.RECOVER:
            return Verdict(WORKER_DIED_RECOVER, Run.Reason.REEXECUTED)
        return Verdict(WORKER_DIED_FAIL, duplicate)
    if status == Run.Status.FAILED:
        if run.reason == Run.Reason.NOT_DELIVERED and not run.executions:
            return Verdict(LATE_DELIVERY, Run.Reason.LATE_DELIVERY)
        if run.reason == Run.Reason.WORKER_LOST and redelivered:
            return Verdict(LOST_REDELIVERED, f"already {status}")
    if status in Run.FINAL_STATUSES:
        return Verdict(FINISHED, f"already {status}")
    return Verdict(DUPLICATE, duplicate)
