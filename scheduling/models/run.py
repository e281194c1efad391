"""The run ledger: one row per run of a periodic task, its named states, and the schedule
health view over it."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now
from django_celery_beat.models import PeriodicTask

from scheduling.timeformat import utc_text


class RunQuerySet(models.QuerySet["Run"]):
    """Named states of the ledger."""

    def pending(self) -> RunQuerySet:
        return self.filter(status=Run.Status.PENDING)

    def scheduled(self) -> RunQuerySet:
        return self.filter(trigger=Run.Trigger.SCHEDULE)

    def finished(self) -> RunQuerySet:
        return self.filter(status__in=Run.FINAL_STATUSES)

    def live(self) -> RunQuerySet:
        """Runs that were not cancelled (a cancelled plan is no part of a task's history)."""
        return self.exclude(status=Run.Status.CANCELLED)

    def latest_scheduled(self) -> RunQuerySet:
        """Scheduled, not cancelled runs, newest slot first: a task's last planned slot."""
        return self.scheduled().live().order_by("-scheduled_for")


class Run(models.Model):
    """One run of a periodic task at its nominal instant ``scheduled_for`` (aware, UTC).

    Lifecycle: pending -> dispatched -> running -> succeeded | failed (retrying in between for
    Celery retries); dispatched -> expired (the message's ``expires`` passed before a worker took
    it); pending -> missed | skipped | cancelled; under the overlap policies that wait
    (``TaskPolicy.BUFFERING``), pending -> buffered (due while its task was busy) -> pending
    again when the busy run ends (the task's oldest buffered run; ``buffered_at`` kept: schema.sql's block
    ``release_buffered``) -> dispatched as above; under replace a run not started when a newer
    slot comes is skipped (``Reason.replaced``). The
    name of the periodic task and its Celery task are copied onto the row so the audit survives
    deleting the task.

    ``executions`` counts the deliveries whose task body the worker guard let run (retries and a
    re-execution after a lost worker included), ``suppressed`` the duplicate deliveries it dropped
    (``scheduling.guard``); ``retries`` is Celery's ``request.retries`` of the latest execution.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DISPATCHED = "dispatched"
        RUNNING = "running"
        RETRYING = "retrying"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        MISSED = "missed"
        SKIPPED = "skipped"
        BUFFERED = "buffered"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule"
        MANUAL = "manual"
        BACKFILL = "backfill"

    class Reason:
        """The texts of ``Run.reason``: the only place they are written.

        Code records and compares these constants, or builds a reason with figures through the
        static methods below; no other module writes a reason as a string literal (a test walks
        the source for it). A reason says why a run ended as it did, for people reading the
        ledger; what a program needs to decide (a misfire's outcome, say) is returned as a value.
        """

        TASK_DELETED = "periodic task deleted"
        TASK_DISABLED = "periodic task disabled"
        TASK_EXPIRED = "periodic task expired"
        SCHEDULE_EDITED = "schedule edited"
        INVALID_SCHEDULE = "invalid schedule"
        DISPATCH_ERROR = "error while dispatching"
        REJECTED = "rejected before dispatch"
        #: A run published by a replica whose claim rolled back, started by a worker.
        ADOPTED = "adopted by the worker: the publishing replica's claim did not commit"
        FIRST_DELIVERY = "first delivery"
        REEXECUTED = "re-executed: redelivered, and the worker that ran it is gone"
        #: A running run closed because its execution lock stayed free (its worker died).
        WORKER_LOST = "worker lost"
        #: Such a run when its attempt's outcome arrived after all (the process lived on).
        LATE_OUTCOME = "outcome recorded after the run was closed as worker lost"
        OVERLAP_IN_BATCH = "overlap: an earlier run of this task was dispatched in the same batch"
        #: A dispatched run no worker started, re-published the most times allowed.
        NOT_DELIVERED = "not delivered"
        #: A run closed as not delivered whose message reached a worker after all.
        LATE_DELIVERY = "delivered after it was closed as not delivered"
        #: A run whose worker died mid-body, re-published under worker-loss policy recover.
        RECOVERED = "recovered: re-published after its worker was lost"
        MESSAGE_EXPIRED = "message expired before a worker took it"
        REVOKED = "revoked"
        UNKNOWN_TASK = "unknown task on the worker"
        REJECTED_BY_WORKER = "rejected by the worker"
        #: The start of ``replaced``'s text.
        REPLACED = "replaced by the run of"

        @staticmethod
        def coalesced(slots: int) -> str:
            """A late run dispatched once for ``slots`` slots (misfire policy coalesce)."""
            return f"misfire: coalesced {slots} slots"

        @staticmethod
        def caught_up(lateness: timedelta) -> str:
            """A late run dispatched on its own (misfire policy catch_up)."""
            return f"misfire: caught up {lateness.total_seconds():.3f} s late"

        @staticmethod
        def missed(policy: str, lateness: timedelta, grace: timedelta) -> str:
            """A late run recorded missed by misfire policy ``policy`` (skip or catch_up)."""
            return (
                f"misfire: {policy} policy, {lateness.total_seconds():.3f} s late"
                f" (grace {grace.total_seconds():g} s)"
            )

        @staticmethod
        def overlap(since: datetime) -> str:
            """A run skipped because the run dispatched at ``since`` is not finished."""
            return f"overlap: the run dispatched at {since.isoformat()} is not finished"

        @staticmethod
        def buffered(since: datetime | None) -> str:
            """A run that waited (an overlap policy of ``TaskPolicy.BUFFERING``) for the run
            dispatched at ``since`` (aware UTC; None: dispatched earlier in the same claim)."""
            behind = "a run dispatched in the same batch" if since is None else (
                f"the run dispatched at {since.isoformat()}"
            )
            return f"buffered: waited for {behind} to finish"

        @staticmethod
        def buffer_full(since: datetime | None) -> str:
            """A run skipped because a run of its task already waits behind the busy one
            (overlap policy buffer_one)."""
            busy = "a run dispatched in the same batch" if since is None else (
                f"the run dispatched at {since.isoformat()}"
            )
            return f"overlap: a run already waits for {busy}"

        @staticmethod
        def behind(waiting: int) -> str:
            """A run buffered behind ``waiting`` earlier slots of its task (overlap policy
            buffer_all keeps slot order)."""
            return f"buffered: waited behind {waiting} earlier runs of this task"

        @staticmethod
        def buffer_limit(limit: int) -> str:
            """A run skipped because ``limit`` runs of its task wait already (overlap policy
            buffer_all, its ``buffer_limit``)."""
            return f"overlap: buffer full, {limit} runs already wait (buffer all)"

        @staticmethod
        def replaced(slot: datetime) -> str:
            """A run ended by overlap policy replace: the run of ``slot`` (aware UTC) replaced
            it (never started: skipped; started and terminated: failed, revoked)."""
            return f"{Run.Reason.REPLACED} {slot.isoformat()}"

        @staticmethod
        def republished(times: int, limit: int, timeout: timedelta) -> str:
            """A dispatched run re-published because no worker started it within ``timeout``."""
            return (
                f"re-published ({times} of {limit}): no worker started it within"
                f" {timeout.total_seconds():g} s"
            )

        @staticmethod
        def paused(by: str, why: str) -> str:
            """The slots that passed while a pause by ``by`` (because ``why``) held the task."""
            return f"paused by {by}: {why}" if why else f"paused by {by}"

        @staticmethod
        def celery_retry(retries: int) -> str:
            """A delivery executing Celery's retry number ``retries`` of the run."""
            return f"Celery retry {retries}"

    FINAL_STATUSES = (
        Status.SUCCEEDED,
        Status.FAILED,
        Status.MISSED,
        Status.SKIPPED,
        Status.CANCELLED,
        Status.EXPIRED,
    )
    #: A run in these states is not finished: it may still execute (overlap policy looks at them).
    UNFINISHED_STATUSES = (Status.DISPATCHED, Status.RUNNING, Status.RETRYING)

    periodic_task = models.ForeignKey(
        PeriodicTask,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="runs",
        # scheduling_run_recent (periodic_task, -scheduled_for) serves every lookup by task; one
        # index fewer to write at each plan and dispatch.
        db_index=False,
    )
    periodic_task_name = models.CharField(max_length=200)
    task = models.CharField("Celery task", max_length=200)
    scheduled_for = models.DateTimeField(
        help_text="The slot of the schedule this run is for (UTC); for a manual run, when it was "
        "asked for."
    )
    # Left out of an INSERT, a trigger sets it to scheduled_for (sql/schema.sql, run_due_at).
    due_at = models.DateTimeField(
        help_text="When the run became due (UTC): its slot, plus the task's jitter when it has "
        "one. Lateness counts from here.",
    )
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SCHEDULE)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.TextField(blank=True, help_text="Why the run was missed, skipped or cancelled.")
    task_id = models.CharField(
        "Celery task id", max_length=255,
        help_text="The id Celery and the workers' logs know this run by; the same for every "
        "delivery of the run.",
    )
    slots = models.PositiveIntegerField(
        default=1,
        help_text="How many slots of the schedule this run stands for: more than 1 when missed "
        "slots were run once together, or slots passed while the task was paused.",
    )
    planned_at = models.DateTimeField(db_default=Now())
    claimed_by = models.CharField("replica", max_length=255, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    error = models.TextField(blank=True)
    requested_by = models.CharField(max_length=150, blank=True)
    retries = models.PositiveIntegerField(
        default=0, help_text="How many times Celery retried the task (0: no retry)."
    )
    executions = models.PositiveIntegerField(
        default=0,
        help_text="How many times the task's code ran for this run, retries and re-runs included.",
    )
    suppressed = models.PositiveIntegerField(
        default=0,
        help_text="Duplicate deliveries of this run, dropped without running the task's code.",
    )
    republished = models.PositiveIntegerField(
        default=0,
        help_text="How many times the run was sent to the workers again, as the same run: no "
        "worker had started it within the delivery deadline, or its worker was lost and the "
        "task is set to recover.",
    )
    republished_at = models.DateTimeField(null=True, blank=True)
    events = models.JSONField(
        null=True,
        blank=True,
        help_text="What happened to the run after it was sent, in order, each with its time "
        "(UTC): sent again, recovered after a lost worker, retried by Celery. Empty when none "
        "of these happened.",
    )
    buffered_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the run was held back because the task's previous run had not finished "
        "(an overlap policy that waits; UTC). Kept after the run was sent.",
    )
    overdue_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the run was found not succeeded past its task's success deadline (UTC).",
    )
    definition_version = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The version of the task's settings this run was planned from, as listed in "
        "the task's edit history. Empty for runs planned before the history began.",
    )

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_for", "-id"]
        constraints = [
            # Invariant 1: one scheduled run per (periodic task, slot). Cancelled plans do not
            # count, so an edit that moves a slot away and back can plan it again.
            models.UniqueConstraint(
                fields=["periodic_task", "scheduled_for"],
                condition=Q(trigger="schedule") & ~Q(status="cancelled"),
                name="scheduling_run_one_per_slot",
            ),
            # Concurrent planners leave one pending scheduled run per task, never two. A released
            # buffered run (pending again, buffered_at set) is not one of them: the next slot was
            # planned when it was buffered.
            models.UniqueConstraint(
                fields=["periodic_task"],
                condition=Q(trigger="schedule", status="pending", buffered_at__isnull=True),
                name="scheduling_run_one_pending_per_task",
            ),
            # Backfills are idempotent: one backfill run per (periodic task, slot).
            models.UniqueConstraint(
                fields=["periodic_task", "scheduled_for"],
                condition=Q(trigger="backfill") & ~Q(status="cancelled"),
                name="scheduling_run_one_backfill_per_slot",
            ),
            models.UniqueConstraint(
                fields=["task_id"],
                condition=~Q(status="cancelled"),
                name="scheduling_run_unique_task_id",
            ),
        ]
        indexes = [
            # "Pending runs due now": a small partial index however large the ledger grows.
            # In the claim's order (due_at, id): a batch stops after its rows, even inside a
            # burst of thousands of runs due at the same instant. Also the poll's next due run.
            models.Index(
                fields=["due_at", "id"],
                condition=Q(status="pending"),
                name="scheduling_run_pending_due",
            ),
            # A task's waiting runs (the overlap policies of TaskPolicy.BUFFERING): buffered,
            # or released and pending again, in slot order: the claim's count of them and the
            # release of the oldest (schema.sql, block release_buffered).
            models.Index(
                fields=["periodic_task", "scheduled_for", "id"],
                condition=Q(buffered_at__isnull=False, status__in=["buffered", "pending"]),
                name="scheduling_run_waiting",
            ),
            # Pending runs whose task was deleted (each reconcile pass looks for them).
            models.Index(
                fields=["scheduled_for"],
                condition=Q(status="pending", periodic_task__isnull=True),
                name="scheduling_run_pending_orphan",
            ),
            models.Index(fields=["periodic_task", "-scheduled_for"], name="scheduling_run_recent"),
            models.Index(fields=["task_id"], name="scheduling_run_task_id"),
            # "Is a run of this task still going?" (overlap policy, in the claim query).
            models.Index(
                fields=["periodic_task", "-dispatched_at"],
                condition=Q(status__in=["dispatched", "running", "retrying"]),
                name="scheduling_run_unfinished",
            ),
            # Dispatched runs by their last publish (the delivery deadline's redelivery, oldest
            # first, and the health probe): a pass reads only the runs published longer ago
            # than the shortest deadline, not every run a backlog (workers down, a broker
            # queue piling up) left dispatched.
            models.Index(
                Coalesce("republished_at", "dispatched_at"), F("id"),
                condition=Q(status="dispatched"),
                name="scheduling_run_published",
            ),
            # Running runs (the lost-worker sweep of every pass, ledger.close_lost_executions):
            # few, however many dispatched runs a backlog leaves beside them.
            models.Index(
                fields=["id"], condition=Q(status="running"), name="scheduling_run_running"
            ),
            # The overdue watch's candidates (ledger.mark_overdue, by slot): scheduled runs not
            # yet found overdue that may still become so. A run leaves it when it succeeds or is
            # marked; failed, missed and expired runs of tasks without a deadline stay, and the
            # watch reads only the slots between the shortest and longest deadline's reach.
            models.Index(
                fields=["scheduled_for"],
                condition=Q(trigger="schedule", overdue_at__isnull=True)
                & ~Q(status__in=["succeeded", "cancelled", "skipped"]),
                name="scheduling_run_overdue_watch",
            ),
            # Overdue runs per task, newest slot first (the health probe, the overdue gauge).
            models.Index(
                fields=["periodic_task", "-scheduled_for"],
                condition=Q(overdue_at__isnull=False),
                name="scheduling_run_overdue",
            ),
        ]

    def __str__(self) -> str:
        """``nightly @ 2026-12-07 19:01:08 UTC (succeeded)``: the slot to the second, in UTC."""
        return f"{self.periodic_task_name} @ {utc_text(self.scheduled_for, 's')} ({self.status})"

    @property
    def lateness(self) -> timedelta | None:
        """dispatched_at - due_at (the jittered due moment), or None before dispatch."""
        if self.dispatched_at is None:
            return None
        return self.dispatched_at - (self.due_at or self.scheduled_for)

    @property
    def runtime(self) -> timedelta | None:
        """finished_at - started_at, or None until both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class ScheduleHealth(Run):
    """The ledger seen per periodic task over a window of time (an admin page, no table)."""

    class Meta:
        proxy = True
        verbose_name = "schedule health"
        verbose_name_plural = "schedule health"
