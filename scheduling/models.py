"""The run ledger: one row per run of a periodic task, and the audit trail shown in admin."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now
from django_celery_beat.models import PeriodicTask


class TaskPolicy(models.Model):
    """How one periodic task handles misfires and overlaps; edited inline on the task's page.

    A task without a row uses the defaults: misfire policy coalesce with the global grace period
    (``SCHEDULING_MISFIRE_GRACE_SECONDS``), overlap policy allow.
    """

    class Misfire(models.TextChoices):
        COALESCE = "coalesce", "coalesce: one run now for all missed slots"
        SKIP = "skip", "skip: record missed slots, wait for the next"
        CATCH_UP = "catch_up", "catch up: run each missed slot in order (capped)"

    class Overlap(models.TextChoices):
        ALLOW = "allow", "allow: runs may overlap"
        SKIP = "skip", "skip: no new run while the previous one is unfinished"

    class WorkerLost(models.TextChoices):
        FAIL = "fail", "fail: close the run as worker lost"
        RECOVER = "recover", "recover: run it again (the task is safe to re-run after a crash)"

    periodic_task = models.OneToOneField(
        PeriodicTask,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="scheduling_policy",
    )
    misfire_policy = models.CharField(
        max_length=16, choices=Misfire.choices, default=Misfire.COALESCE
    )
    misfire_grace_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="A run later than this after its slot is a misfire. Empty: the global setting.",
    )
    catch_up_limit = models.PositiveIntegerField(
        default=100, help_text="Most missed slots run one by one under catch up."
    )
    overlap_policy = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.ALLOW)
    overlap_stale_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="An unfinished run older than this no longer blocks (overlap skip). "
        "Empty: the global setting.",
    )

    worker_lost_policy = models.CharField(
        max_length=16,
        choices=WorkerLost.choices,
        blank=True,
        help_text="A run whose worker died mid-body. Empty: the global setting "
        "(SCHEDULING_WORKER_LOST_POLICY).",
    )
    delivery_timeout_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="A dispatched run no worker started within this is re-published (same task "
        "id). Empty: the global setting (SCHEDULING_DELIVERY_TIMEOUT).",
    )
    jitter_seconds = models.PositiveIntegerField(
        default=0,
        help_text="Each run is due up to this many seconds after its slot, by an offset derived "
        "from (task, slot): the same on every replica, never past the next slot. 0: none.",
    )
    success_deadline_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="A scheduled run that has not succeeded this long after its slot is overdue "
        "(an alert). Empty: the global setting (SCHEDULING_SUCCESS_DEADLINE; unset: no alert).",
    )

    class Meta:
        verbose_name = "scheduling policy"
        verbose_name_plural = "scheduling policies"

    def __str__(self) -> str:
        return f"misfire {self.misfire_policy}, overlap {self.overlap_policy}"


class ScheduleChange(models.Model):
    """One change of a periodic task's definition or of a schedule row, written by triggers.

    PostgreSQL triggers (migration 0005) insert a row for every UPDATE that changes a crontab,
    interval, solar or clocked row, or a periodic task's scheduling columns (schedule ids,
    start_time, expires, one_off, enabled, date_changed), however it was made: ``save()``,
    ``QuerySet.update()`` or raw SQL. The same statement moves django-celery-beat's change marker
    (except for a change that only disables tasks: their due runs are cancelled by the claim), so
    every replica reconciles on its next tick, and ``ledger.reconcile`` re-plans only the
    pending runs of the tasks these rows name: the cost follows what changed, not the number of
    tasks. Rows older than ``ledger.CHANGE_RETENTION`` are pruned by the reconcile pass.
    """

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


class PauseQuerySet(models.QuerySet["Pause"]):
    """Named states of pauses."""

    def open(self) -> PauseQuerySet:
        """Pauses not resumed yet: at most one per periodic task."""
        return self.filter(resumed_at__isnull=True)


class Pause(models.Model):
    """One pause of a periodic task: who paused it, when (database clock) and why; and its end.

    A paused task stays ``enabled`` (see docs/semantics.md, "Pause"): its due runs are not
    dispatched; the first one due is closed ``skipped`` by the claim (reason
    ``Run.Reason.paused``) and linked here as ``run``, no further slot is planned, and the resume
    (``ledger.resume``) sets that row's ``slots`` to the number of slots that passed while paused
    and plans the first slot after the resume. Rows are kept after the resume as the audit of
    pauses. Written only by ``scheduling.ledger.pausing`` (and the claim's link to ``run``).
    """

    id = models.BigAutoField(primary_key=True)
    periodic_task = models.ForeignKey(
        PeriodicTask, on_delete=models.CASCADE, related_name="scheduling_pauses"
    )
    paused_at = models.DateTimeField(help_text="When the pause began (database clock, UTC).")
    paused_by = models.CharField(max_length=150)
    why = models.TextField(blank=True, help_text="Why the task was paused.")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.CharField(max_length=150, blank=True)
    run = models.ForeignKey(
        "Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The one skipped run that records the slots passed while paused.",
    )

    objects = PauseQuerySet.as_manager()

    class Meta:
        ordering = ["-paused_at", "-id"]
        constraints = [
            # One open pause per task: a second pause of a paused task is refused by the database.
            # Also the index of "is this task paused?" (the claim query, planning).
            models.UniqueConstraint(
                fields=["periodic_task"],
                condition=Q(resumed_at__isnull=True),
                name="scheduling_pause_one_open_per_task",
            ),
        ]

    def __str__(self) -> str:
        return f"pause of {self.periodic_task_id} since {self.paused_at:%Y-%m-%d %H:%M:%S}"


class TaskVersion(models.Model):
    """The version counter of one periodic task's definition, kept by database triggers.

    Migration 0016's triggers set it to 1 when a task is created and add 1 at every change of the
    task, of its schedule row (a crontab shared by ten tasks moves all ten) or of its scheduling
    policy, however made: admin, ORM or raw SQL; each change is one ``TaskHistory`` row carrying
    the new number. Planning reads it with the task (``select_related("scheduling_version")``,
    one join, no query per run) and writes it on the run as ``Run.definition_version``. No
    foreign key constraint: a task deleted by raw SQL must not be refused; the trigger deletes
    the row with the task.
    """

    periodic_task = models.OneToOneField(
        PeriodicTask,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        primary_key=True,
        related_name="scheduling_version",
    )
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"version {self.version}"


class OwedRunCount(models.Model):
    """Dispatched runs a periodic task's ``total_run_count``/``last_run_at`` do not count yet.

    A claim inserts one row per task it dispatched scheduled runs for, in its own transaction
    (``ledger.TaskBook.owe``): the count is owed exactly when the runs are committed, and a
    replica killed at any instant after that loses none of it. A replica's ``TaskBook.settle``
    moves the rows onto django-celery-beat's task rows every ``bookkeeping.EVERY`` seconds and
    deletes them, in one statement (``queries.sql``, ``settle_run_counts``): whichever replica
    locks a row (SKIP LOCKED) settles it, once. No foreign key: a deleted task's rows are
    dropped by the settle, and the claim's insert checks nothing.
    """

    id = models.BigAutoField(primary_key=True)
    periodic_task_id = models.IntegerField(help_text="Id of the periodic task (no constraint).")
    runs = models.PositiveIntegerField(help_text="Scheduled runs the claim dispatched.")
    last_slot = models.DateTimeField(help_text="The newest of those runs' slots (UTC).")

    def __str__(self) -> str:
        return f"{self.runs} runs of task {self.periodic_task_id} up to {self.last_slot}"


class TaskHistory(models.Model):
    """One change of a periodic task's definition: when, what (before and after), who, version.

    Written only by database triggers (migration 0016) on django-celery-beat's periodic task and
    schedule tables and on ``TaskPolicy``, in the transaction of the change, so an edit by raw
    SQL is kept as surely as one in the admin. ``before`` and ``after`` hold the columns that
    changed (the whole row for a creation or deletion, ``before`` empty or ``after`` empty);
    the task's bookkeeping columns ``last_run_at`` and ``total_run_count`` are never part of a
    change. A schedule row shared by several tasks gives one row per task. ``actor`` is the admin
    user who saved (passed through the transaction-local setting ``scheduling.actor``), empty
    when not known; ``role`` is the SQL role that ran the statement. ``version`` is the task's
    definition version after the change, the one ``Run.definition_version`` names. Rows outlive
    their task (no foreign key): the audit survives deletion.
    """

    class Kind(models.TextChoices):
        TASK = "task"
        INTERVAL = "interval"
        CRONTAB = "crontab"
        SOLAR = "solar"
        CLOCKED = "clocked"
        POLICY = "policy"

    class Operation(models.TextChoices):
        CREATED = "created"
        CHANGED = "changed"
        DELETED = "deleted"
        #: The definition as it stood when the history began (migration 0016).
        RECORDED = "recorded"

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
        verbose_name_plural = "edit history"
        ordering = ["-changed_at", "-id"]
        constraints = [
            # One entry per version of a task: the run's definition_version names exactly one.
            models.UniqueConstraint(
                fields=["periodic_task_id", "version"], name="scheduling_history_one_per_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.periodic_task_name} version {self.version}: {self.kind} {self.operation}"


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
    it); pending -> missed | skipped | cancelled. The name of the periodic task and its Celery task
    are copied onto the row so the audit survives deleting the task.

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
    scheduled_for = models.DateTimeField(help_text="Nominal instant of the run (UTC).")
    due_at = models.DateTimeField(
        help_text="When the run is due (UTC): scheduled_for plus the task's jitter offset. "
        "Lateness is measured from it. Left empty on insert, the database sets scheduled_for.",
    )
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SCHEDULE)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.TextField(blank=True, help_text="Why the run was missed, skipped, cancelled.")
    task_id = models.CharField(
        "Celery task id", max_length=255, help_text="Derived from (periodic task, scheduled_for)."
    )
    slots = models.PositiveIntegerField(
        default=1, help_text="Number of schedule slots this run stands for (coalesced misfires)."
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
        default=0, help_text="Celery's request.retries of the latest execution (0: first try)."
    )
    executions = models.PositiveIntegerField(
        default=0, help_text="Deliveries whose task body ran (retries and re-executions included)."
    )
    suppressed = models.PositiveIntegerField(
        default=0, help_text="Duplicate deliveries of this run dropped without running the body."
    )
    republished = models.PositiveIntegerField(
        default=0,
        help_text="Times a replica re-published this run's message with the same task id (no "
        "worker started it within the delivery deadline, or its worker was lost and the task "
        "recovers).",
    )
    republished_at = models.DateTimeField(null=True, blank=True)
    events = models.JSONField(
        null=True,
        blank=True,
        help_text="What happened to the run after its dispatch, in order: each re-publish and "
        "each Celery retry, as [{\"at\": ISO time (database clock, UTC), \"kind\": "
        "\"republished\" | \"recovered\" | \"retry\", \"detail\": text}]; empty for a run "
        "that had none.",
    )
    overdue_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When a replica found the run not succeeded past its task's success deadline "
        "(database clock); set once, by one replica (scheduling.overdue).",
    )
    definition_version = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The task's definition version this run was planned from (its edit history "
        "entry); empty for runs planned before the history began.",
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
            # Concurrent planners leave one pending scheduled run per task, never two.
            models.UniqueConstraint(
                fields=["periodic_task"],
                condition=Q(trigger="schedule", status="pending"),
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
        return f"{self.periodic_task_name} @ {self.scheduled_for:%Y-%m-%d %H:%M:%S} ({self.status})"

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


class Replica(models.Model):
    """One beat replica as it last reported itself: for display and health probes only.

    ``scheduling.replicas.Heartbeat`` upserts the row at most every
    ``SCHEDULING_HEARTBEAT_INTERVAL`` seconds, outside any claim transaction; times are the
    database clock (aware, UTC). Nothing in the claim path reads it: a replica without a row, or
    with a stale one, dispatches as usual.
    ``runs_claimed`` counts the runs this process committed a claim on since ``started_at``.
    ``stopped_at`` is set on a clean shutdown; a killed replica keeps its last tick and shows stale.
    """

    id = models.CharField("replica", max_length=255, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_tick_at = models.DateTimeField()
    runs_claimed = models.PositiveBigIntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_tick_at"]

    def __str__(self) -> str:
        return self.id


class ScheduleHealth(Run):
    """The ledger seen per periodic task over a window of time (an admin page, no table)."""

    class Meta:
        proxy = True
        verbose_name = "schedule health"
        verbose_name_plural = "schedule health"
