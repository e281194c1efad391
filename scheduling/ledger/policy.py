"""Misfire and overlap policies as pure decisions: values returned, nothing written.

The claim (``scheduling.ledger.claim``) asks these functions what to do with each claimed run
and applies the answer. They read the task, its ``TaskPolicy`` (loaded with it) and the slot
maths of ``scheduling.slots``; no database, no clock of their own (``now`` is the database clock
the claim read). Rules: docs/semantics.md, misfire and overlap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.models import Run, TaskPolicy

logger = logging.getLogger(__name__)

#: Most missed slots recorded as rows of their own by one misfire; past it the last row's
#: ``slots`` counts the rest.
MISSED_ROWS_LIMIT = 1000
#: Most slots one missed row stands for (``Run.slots`` is a PostgreSQL integer).
SLOTS_COLUMN_MAX = 2**31 - 1


@dataclass(frozen=True)
class MisfireDecision:
    """What the misfire policy does with one late run.

    ``outcome`` is COALESCED (dispatch once for ``slots`` slots), CAUGHT_UP (dispatch this slot
    alone) or MISSED (record the run missed, and the slots ``missed`` after it, one row each, the
    last standing for ``last_row_slots`` slots). ``next_slot`` is the slot to plan next (None when
    the schedule is over); ``reason`` goes on the run (``Run.Reason``).
    """

    COALESCED = "coalesced"
    CAUGHT_UP = "caught_up"
    MISSED = "missed"

    outcome: str
    reason: str
    next_slot: datetime | None
    slots: int = 1
    missed: tuple[datetime, ...] = ()
    last_row_slots: int = 1

    @property
    def dispatches(self) -> bool:
        """Whether the run is dispatched (coalesced or caught up), not recorded missed."""
        return self.outcome != self.MISSED

    @property
    def misfired_slots(self) -> int:
        """The slots this misfire accounted for: the run's and every missed row's."""
        if self.outcome != self.MISSED:
            return self.slots if self.outcome == self.COALESCED else 1
        return 1 + len(self.missed) + (self.last_row_slots - 1 if self.missed else 0)


def task_grace(task: PeriodicTask, default: timedelta) -> timedelta:
    """The task's misfire grace period: its policy's ``misfire_grace_seconds``, else ``default``.

    Reads the policy cached by ``select_related("scheduling_policy")``; no query of its own then.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    if policy is not None and policy.misfire_grace_seconds is not None:
        return timedelta(seconds=policy.misfire_grace_seconds)
    return default


def misfire(
    task: PeriodicTask,
    slot: datetime,
    now: datetime,
    default_grace: timedelta,
    due: datetime | None = None,
) -> MisfireDecision | None:
    """Decide what the task's misfire policy does with its run of ``slot``; None when on time.

    The run is a misfire when its lateness, ``now - due`` (``due``: the run's jittered due
    moment, ``slot`` when None), exceeds the grace period (``task_grace``). Policies:

    - coalesce (the default, also for a task without a policy row): the run is dispatched once,
      standing for itself and every slot up to ``now`` (``slots``); the next slot is after ``now``.
    - skip: the run and every later slot at or before ``now - grace`` are recorded ``missed``
      (one row each, at most MISSED_ROWS_LIMIT more; the last row's ``slots`` counts the rest);
      the next slot is the first one after ``now - grace`` (it is dispatched at once if already
      due: a slot still inside its grace period runs under every policy).
    - catch_up: the missed slots (this run's and the later ones at or before ``now - grace``) are
      dispatched one by one in order, one run each, the most recent ``catch_up_limit`` of them;
      older ones are recorded ``missed`` like skip. The rule is stateless: each late run of the
      replay counts the missed slots after it, so the replay stops being late after the cap.

    An interval's missed slots are counted exactly by arithmetic, so years of a 1 s interval are
    accounted for in one claim. Other schedules are counted slot by slot: past
    ``slots.MAX_COUNTED_SLOTS`` missed slots, skip and catch_up account for that many in one
    claim and plan the slot after them, still late, so the next claims go on until every slot is
    accounted for.

    Raises ScheduleError when the schedule cannot produce the following slots.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    grace = task_grace(task, default_grace)
    lateness = now - (due or slot)
    if lateness <= grace:
        return None
    kind = TaskPolicy.Misfire.COALESCE if policy is None else policy.misfire_policy
    if kind == TaskPolicy.Misfire.COALESCE or policy is None:
        missed, nxt = slots.slots_through(task, slot, now)
        return MisfireDecision(
            MisfireDecision.COALESCED, Run.Reason.coalesced(1 + missed), nxt, slots=1 + missed
        )
    return _skip_or_catch_up(task, policy, slot, now, grace, lateness)


def _skip_or_catch_up(
    task: PeriodicTask,
    policy: TaskPolicy,
    slot: datetime,
    now: datetime,
    grace: timedelta,
    lateness: timedelta,
) -> MisfireDecision:
    """Misfire policy skip or catch_up on a run of ``slot``, ``lateness`` late, past ``grace``,
    at ``now`` (``misfire``'s rules)."""
    kind = policy.misfire_policy
    later, following = slots.slots_through(
        task, slot, now - grace, cap=SLOTS_COLUMN_MAX - MISSED_ROWS_LIMIT
    )
    limit = policy.catch_up_limit if kind == TaskPolicy.Misfire.CATCH_UP else 0
    if later < limit:  # among the most recent ``limit`` missed slots: dispatch it
        return MisfireDecision(
            MisfireDecision.CAUGHT_UP, Run.Reason.caught_up(lateness), slots.next_run(task, slot)
        )
    skipped = later + 1 - limit  # this run and the following slots that will not run
    if limit or later >= slots.MAX_COUNTED_SLOTS:
        # the slot after the skipped ones; past the counting cap that is still late, and the
        # next claim goes on from there, so every slot is accounted for
        following = slots.nth_slot_after(task, slot, skipped)
    missed_slots = tuple(slots.slots_after(task, slot, min(skipped - 1, MISSED_ROWS_LIMIT)))
    rest = skipped - MISSED_ROWS_LIMIT if missed_slots and skipped - 1 > MISSED_ROWS_LIMIT else 1
    return MisfireDecision(
        MisfireDecision.MISSED,
        Run.Reason.missed(kind, lateness, grace),
        following,
        missed=missed_slots,
        last_row_slots=rest,
    )


def one_off_misfire(
    task: PeriodicTask,
    slot: datetime,
    now: datetime,
    default_grace: timedelta,
    due: datetime | None = None,
) -> MisfireDecision | None:
    """Decide what a one-off's misfire policy does with its single run; None when on time.

    A one-off's run is late when its lateness, ``now - due`` (``due``: the jittered due moment,
    else ``slot``), exceeds its grace (``task_grace``). Policies skip, and catch_up with
    ``catch_up_limit`` 0, record it missed (MISSED); coalesce (also without a policy row) and
    catch_up dispatch it, standing for its one slot, with the lateness as its reason
    (CAUGHT_UP), so a clocked one-off found past due says why it ran late. The schedule is over
    either way: ``next_slot`` is None.
    """
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    grace = task_grace(task, default_grace)
    lateness = now - (due or slot)
    if lateness <= grace:
        return None
    kind = TaskPolicy.Misfire.COALESCE if policy is None else policy.misfire_policy
    if kind == TaskPolicy.Misfire.COALESCE or (
        kind == TaskPolicy.Misfire.CATCH_UP and policy is not None and policy.catch_up_limit > 0
    ):
        return MisfireDecision(MisfireDecision.CAUGHT_UP, Run.Reason.caught_up(lateness), None)
    return MisfireDecision(MisfireDecision.MISSED, Run.Reason.missed(kind, lateness, grace), None)




def overlap(
    task: PeriodicTask | None,
    trigger: str,
    slot: datetime,
    *,
    in_batch: bool,
    busy_since: datetime | None,
    now: datetime,
    default_stale: float,
) -> str:
    """Return why the task is busy for this run under its overlap policy, or "" when it is not.

    The overlap policies that watch (``TaskPolicy.WATCHING``) apply to scheduled and backfill
    runs, not manual ones; the text is the skip reason of overlap skip, and ``decision.decide``
    says what the other policies do: the task is busy while an earlier run of its
    task was dispatched in the same batch (``in_batch``), or is dispatched, running or retrying
    since ``busy_since`` (the newest such dispatch, aware UTC) less than the staleness bound ago
    (``overlap_stale_seconds``, else ``default_stale`` seconds: a lost worker cannot block the
    task forever). ``now`` is the
    database clock of the claim.
    """
    if task is None or trigger == Run.Trigger.MANUAL:
        return ""
    policy: TaskPolicy | None = getattr(task, "scheduling_policy", None)
    if policy is None or policy.overlap_policy not in TaskPolicy.WATCHING:
        return ""
    if in_batch:
        return Run.Reason.OVERLAP_IN_BATCH
    if busy_since is None:
        return ""
    bound = stale_bound(policy, default_stale)
    if now - busy_since > bound:
        logger.warning(
            "run of %r at %s: the unfinished run dispatched at %s is older than %s; not skipping",
            task.name, slot, busy_since, bound, extra={"action": "overlap_stale"},
        )
        return ""
    return Run.Reason.overlap(busy_since)


def stale_bound(policy: TaskPolicy | Any, default_stale: float) -> timedelta:
    """How long an unfinished run holds a new slot of its task back under an overlap policy:
    the policy's ``overlap_stale_seconds``, else ``default_stale`` seconds
    (``SCHEDULING_OVERLAP_STALE_SECONDS``); past it the run is taken for lost."""
    stale = policy.overlap_stale_seconds
    return timedelta(seconds=default_stale if stale is None else stale)
