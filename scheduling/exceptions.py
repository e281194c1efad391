"""The error family of the ``scheduling`` app.

    SchedulingError
    ├── ScheduleError      a schedule definition gives no usable slot (bad crontab, zero interval)
    ├── RunRejected        one run cannot be published (bad args JSON, unknown task name)
    ├── BackfillRejected   a backfill range is not a past range
    ├── RunNowRefused      run now of a disabled or finished task, without force
    ├── PauseRejected      a pause of a paused task, or a resume of one that is not paused
    └── PublishFailed      a publish failed for a reason not of the run's own (the broker)

Database errors are not wrapped, and PublishFailed keeps the broker's error as its cause: both
abort the claim transaction, which is the point. ``describe`` says an error in one line.
"""

from __future__ import annotations

from django.db import DatabaseError


class SchedulingError(Exception):
    """Base class for errors raised by the ``scheduling`` app."""


class ScheduleError(SchedulingError):
    """A periodic task's schedule cannot produce a slot; the message says why."""


class RunRejected(SchedulingError):
    """A run cannot be published; it is recorded as failed with this message as its reason."""


class BackfillRejected(SchedulingError):
    """A backfill request cannot be served (range empty, reversed or not in the past)."""


class RunNowRefused(SchedulingError):
    """A manual run of a disabled or finished task was asked for without force; says why."""


class PauseRejected(SchedulingError):
    """A pause or resume cannot be done: the task is already paused, or is not paused."""


class PublishFailed(SchedulingError):
    """Publishing a run's message failed for a reason not of the run's own (the broker).

    Raised from the claim so that the whole claim rolls back; the cause is the broker's error.
    """


def describe(exc: BaseException) -> str:
    """Return ``exc``'s message on one line, with the database error it came after, if any.

    The replica's one outage line uses it (``schedulers.LedgerScheduler``).

    A COMMIT that fails on a lost connection (a replica cut off from the server, after
    ``tcp_user_timeout``) is replaced by the error of Django's reconnect in ``atomic``'s
    ``finally`` (``set_autocommit``), which a cut-off replica gets after ``connect_timeout``:
    "connection timeout expired (after: consuming input failed: could not receive data from
    server: Connection timed out)" says both.
    """
    error = " ".join(str(exc).split()) or type(exc).__name__
    earlier = exc.__context__
    while earlier is not None:
        first = " ".join(str(earlier).split())
        if isinstance(earlier, DatabaseError) and first and first != error:
            return f"{error} (after: {first})"
        earlier = earlier.__context__
    return error
