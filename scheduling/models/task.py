"""What the app keeps beside a periodic task: its policy, pauses, definition version and the
run counts owed to its row."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
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
        BUFFER_ONE = (
            "buffer_one",
            "buffer one: while a run is unfinished, the next waits and runs after it; "
            "further slots are skipped",
        )
        BUFFER_ALL = (
            "buffer_all",
            "buffer all: while a run is unfinished, every further slot waits and runs after it, "
            "in slot order, one at a time (up to the buffer limit)",
        )
        REPLACE = (
            "replace",
            "replace: a new slot ends the unfinished run (not started: it never starts; "
            "started: as 'replace started' says) and runs instead",
        )

    class ReplaceStarted(models.TextChoices):
        FINISH = "finish", "finish: the started run finishes, then the new slot runs"
        TERMINATE = "terminate", "terminate: revoke the started run (SIGTERM), then run the new slot"

    #: The overlap policies that watch for an unfinished run of the task (the claim reads whether
    #: it is busy, and ``decision.decide`` says what follows): every one but allow.
    WATCHING = (Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL, Overlap.REPLACE)
    #: Those under which a run may wait, recorded buffered: the claim counts a task's
    #: waiting runs, and the database releases them (schema.sql, block release_buffered).
    BUFFERING = (Overlap.BUFFER_ONE, Overlap.BUFFER_ALL, Overlap.REPLACE)
    #: An overlap policy's parameter in words, from the policy's fields ("buffer all (limit 100)").
    OVERLAP_DETAIL = {Overlap.BUFFER_ALL: "limit {buffer_limit}", Overlap.REPLACE: "{replace_started}"}

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
    buffer_limit = models.PositiveIntegerField(
        default=100,
        help_text="Overlap buffer all: most runs waiting at once. A slot due while this many wait "
        "is recorded skipped (buffer full).",
    )
    replace_started = models.CharField(
        max_length=16,
        choices=ReplaceStarted.choices,
        default=ReplaceStarted.FINISH,
        help_text="Overlap replace, when the unfinished run has already started: let it finish "
        "(its outcome kept) or revoke it with terminate; the new slot runs once it has ended.",
    )
    overlap_stale_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="An unfinished run dispatched longer ago than this no longer holds a new slot "
        "back (every overlap policy but allow). Empty: the global setting.",
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

    The triggers of sql/schema.sql's block ``history`` set it to 1 when a task is created and
    add 1 at every change of the task, of its schedule row (a crontab shared by ten tasks moves
    all ten) or of its scheduling policy, however made: admin, ORM or raw SQL; each change is
    one ``TaskHistory`` row carrying the new number. Planning reads it with the task
    (``select_related("scheduling_version")``, one join, no query per run) and writes it on the
    run as ``Run.definition_version``. No foreign key constraint: a task deleted by raw SQL must
    not be refused; the trigger deletes the row with the task."""

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
