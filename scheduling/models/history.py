"""Changes of a periodic task's definition, written by database triggers: the change log the
reconcile pass reads, and the edit history shown in admin."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class ScheduleChange(models.Model):
    """One change of a periodic task's definition or of a schedule row, written by triggers.

    PostgreSQL triggers (block ``change_log`` of sql/schema.sql) insert a row for every UPDATE
    that changes a crontab, interval, solar or clocked row, or a periodic task's scheduling
    columns (schedule ids, start_time, expires, one_off, enabled, date_changed), however it was
    made: ``save()``, ``QuerySet.update()`` or raw SQL. The same statement moves
    django-celery-beat's change marker (except for a change that only disables tasks: their due
    runs are cancelled by the claim), so every replica reconciles on its next tick, and
    ``ledger.reconcile`` re-plans only the pending runs of the tasks these rows name: the cost
    follows what changed, not the number of tasks. Rows older than ``ledger.CHANGE_RETENTION``
    are pruned by the reconcile pass."""

    class Kind(models.TextChoices):
        TASK = "task"
        INTERVAL = "interval"
        CRONTAB = "crontab"
        SOLAR = "solar"
        CLOCKED = "clocked"
        #: A task that may have no pending run: just created (insert trigger), or its schedule
        #: failed to give the next slot at claim time. Only planned, never re-planned.
        UNPLANNED = "unplanned"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    object_id = models.IntegerField(help_text="Id of the periodic task or schedule row.")
    changed_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["changed_at"], name="scheduling_change_at")]

    def __str__(self) -> str:
        return f"{self.kind} {self.object_id} changed at {self.changed_at}"


class TaskHistory(models.Model):
    """One change of a periodic task's definition: when, what (before and after), who, version.

    Written only by database triggers (block ``history`` of sql/schema.sql) on
    django-celery-beat's periodic task and schedule tables and on ``TaskPolicy``, in the
    transaction of the change, so an edit by raw SQL is kept as surely as one in the admin.
    ``before`` and ``after`` hold the columns that changed (the whole row for a creation or
    deletion, ``before`` empty or ``after`` empty); the task's bookkeeping columns
    ``last_run_at``, ``total_run_count`` and ``date_changed`` are never part of a change. Pauses
    and resumes are entries too (kind ``pause``, written by ``ledger.pause`` and
    ``ledger.resume`` with the pause row): who (``actor``), when, why (``after``), with the
    version in force, which they do not move. A schedule row shared by
    several tasks gives one row per task. ``actor`` is the admin user who saved (passed through
    the transaction-local setting ``scheduling.actor``), empty when not known; ``role`` is the
    SQL role that ran the statement. ``version`` is the task's definition version after the
    change, the one ``Run.definition_version`` names. Rows outlive their task (no foreign key):
    the audit survives deletion."""

    class Kind(models.TextChoices):
        TASK = "task"
        INTERVAL = "interval"
        CRONTAB = "crontab"
        SOLAR = "solar"
        CLOCKED = "clocked"
        POLICY = "policy"
        #: A pause or a resume (``ledger.pause``, ``ledger.resume``): no change of the definition.
        PAUSE = "pause"

    class Operation(models.TextChoices):
        CREATED = "created"
        CHANGED = "changed"
        DELETED = "deleted"
        #: The definition as it stood when the history began (block ``history`` of sql/schema.sql).
        RECORDED = "recorded"
        PAUSED = "paused"
        RESUMED = "resumed"

    id = models.BigAutoField(primary_key=True)
    periodic_task_id = models.IntegerField()
    periodic_task_name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    object_id = models.IntegerField(help_text="Id of the row that changed.")
    operation = models.CharField(max_length=16, choices=Operation.choices)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    changed_at = models.DateTimeField(db_default=Now())
    actor = models.CharField(max_length=150, blank=True, help_text="Admin user, when known.")
    role = models.CharField("SQL role", max_length=150)

    class Meta:
        verbose_name = "edit history entry"
        verbose_name_plural = "edit history entries"
        ordering = ["-changed_at", "-id"]
        constraints = [
            # One definition change per version of a task: the run's definition_version names
            # exactly one. A pause entry carries the version in force and changes none.
            models.UniqueConstraint(
                fields=["periodic_task_id", "version"], condition=~Q(kind="pause"),
                name="scheduling_history_one_per_version",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.periodic_task_name} version {self.version}: {self.kind} {self.operation}"
