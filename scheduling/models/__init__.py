"""The run ledger: one row per run of a periodic task, and the audit trail shown in admin.

One module per concept: ``run`` (the ledger, ``Run``, and the ``ScheduleHealth`` view over it),
``task`` (what is kept beside a periodic task: ``TaskPolicy``, ``Pause``, ``TaskVersion``,
``OwedRunCount``), ``history`` (trigger-written changes: ``ScheduleChange``, ``TaskHistory``),
``replica`` (``Replica``). Import the models from here.
"""

from __future__ import annotations

from scheduling.models.history import ScheduleChange, TaskHistory
from scheduling.models.replica import Replica
from scheduling.models.run import Run, RunQuerySet, ScheduleHealth
from scheduling.models.task import OwedRunCount, Pause, PauseQuerySet, TaskPolicy, TaskVersion

__all__ = [
    "OwedRunCount",
    "Pause",
    "PauseQuerySet",
    "Replica",
    "Run",
    "RunQuerySet",
    "ScheduleChange",
    "ScheduleHealth",
    "TaskHistory",
    "TaskPolicy",
    "TaskVersion",
]
