"""Admin: the run ledger as a read-only audit view; "Run now" and "Backfill" through the ledger.

Importing this package registers every admin of the app (Django's admin autodiscovery does):
``runs`` (the ledger), ``periodic_tasks`` (django-celery-beat's task admin replaced, with the
forms of its actions in ``task_forms``), ``replicas``, ``schedule_health``, ``schedules`` (the
schedule rows' admins replaced) and ``edit_history``; ``base`` holds what they share. Every
admin class is importable from here.
"""

from __future__ import annotations

from scheduling.admin.base import (
    ADMIN_CSS,
    RECENT_PAUSES,
    RECENT_RUNS,
    ReadOnlyAdmin,
    RecordsActorAdmin,
)
from scheduling.admin.edit_history import TaskHistoryAdmin
from scheduling.admin.periodic_tasks import PeriodicTaskAdmin, PeriodicTaskForm, TaskPolicyInline
from scheduling.admin.replicas import REPLICA_COLOURS, ReplicaAdmin
from scheduling.admin.runs import RunAdmin
from scheduling.admin.schedule_health import HealthWindowForm, ScheduleHealthAdmin
from scheduling.admin.schedules import (
    ClockedScheduleAdmin,
    CrontabScheduleAdmin,
    CrontabScheduleForm,
    IntervalScheduleAdmin,
    SolarScheduleAdmin,
)
from scheduling.admin.task_forms import BackfillForm, PauseForm

__all__ = [
    "ADMIN_CSS",
    "RECENT_PAUSES",
    "RECENT_RUNS",
    "REPLICA_COLOURS",
    "BackfillForm",
    "ClockedScheduleAdmin",
    "CrontabScheduleAdmin",
    "CrontabScheduleForm",
    "HealthWindowForm",
    "IntervalScheduleAdmin",
    "PauseForm",
    "PeriodicTaskAdmin",
    "PeriodicTaskForm",
    "ReadOnlyAdmin",
    "RecordsActorAdmin",
    "ReplicaAdmin",
    "RunAdmin",
    "ScheduleHealthAdmin",
    "SolarScheduleAdmin",
    "TaskHistoryAdmin",
    "TaskPolicyInline",
]
