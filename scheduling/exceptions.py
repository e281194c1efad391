"""The error family of the ``scheduling`` app.

    SchedulingError
    ├── ScheduleError      a schedule definition gives no usable slot (bad crontab, zero interval)
    ├── RunRejected        one run cannot be published (bad args JSON, unknown task name)
    ├── BackfillRejected   a backfill range is not a past range
    ├── RunNowRefused      run now of a disabled or finished task, without force
    ├── PauseRejected      a pause of a paused task, or a resume of one that is not paused
    └── PublishFailed      a publish failed for a reason not of the run's own (the broker)

Database errors are not wrapped, and PublishFailed keeps the broker's error as its cause: both
abort the claim transaction, which is the point.
"""

from __future__ import annotations


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
