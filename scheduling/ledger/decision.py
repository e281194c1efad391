"""What the claim does with one claimed run, as a value: ``decide`` returns a ``Decision``.

``decide`` is pure: it reads the claimed run's fields, its task (a ``claim_rows.ClaimedTask`` or a
``PeriodicTask``, with its ``TaskPolicy`` as ``scheduling_policy``), the database clock the claim
read and whether the task is busy, and returns one ``Decision``; it writes nothing, opens no
transaction and reads no clock of its own. The claim (``scheduling.ledger.claim``) applies the
decision in one place. The order of the rules: load error, deleted task, disabled task, expiry,
pause, then the misfire policy (``policy.misfire``, ``policy.one_off_misfire``), then the overlap
policy (``policy.overlap``). Rules: docs/semantics.md and docs/lifecycle.md.

The overlap policies that wait (docs/lifecycle.md): under ``buffer_one`` a run due while its
task is busy is recorded ``buffered`` (BUFFER) when no other run of the task waits, else
skipped; under ``buffer_all`` it is buffered, and so is a run due while earlier slots of its task
wait (slot order), up to the task's ``buffer_limit``, past which it is skipped; under ``replace``
the claim ends the task's unfinished runs first (REPLACE: it reads which have started, which no
value read before the claim can say) and then dispatches the run or buffers it behind the
started one. The database makes the task's oldest buffered run pending again when the busy run
ends (schema.sql, ``release_buffered``), and its claim (``released``) dispatches it without
asking the misfire policy or planning a slot (its next slot was planned when it was buffered);
still busy (another run started meanwhile), it is buffered again.
"""

from __future__ import annotations

import enum
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from scheduling import slots
from scheduling.exceptions import ScheduleError
from scheduling.ledger.policy import MisfireDecision, misfire, one_off_misfire, overlap
from scheduling.models import Run, TaskPolicy


class Kind(enum.StrEnum):
    """What happens to a claimed run."""

    #: Publish it and commit it ``dispatched`` (a rejected publish still records it failed).
    DISPATCH = "dispatch"
    #: It ends here without a dispatch: ``failed`` or ``cancelled`` (``Decision.status``).
    CLOSE = "close"
    #: Misfire policy skip or catch_up: recorded ``missed``, with the later missed slots.
    MISS = "miss"
    #: Overlap policy skip, or a paused task: recorded ``skipped``.
    SKIP = "skip"
    #: An overlap policy that waits (``TaskPolicy.BUFFERING``): recorded ``buffered``, dispatched when
    #: the busy run ends.
    BUFFER = "buffer"
    #: Overlap policy replace: the task's unfinished runs are ended, then the run is dispatched
    #: (or buffered behind a started one the policy lets finish or terminates).
    REPLACE = "replace"


class Decision(NamedTuple):
    """The claim's decision on one run (an immutable value; a tuple, as cheap as one to build:
    a claim makes one per run).

    ``status`` is the run's status once applied (``Run.Status``); ``reason`` the reason written
    on it (None: the run's own is kept), ``error`` its error text, ``slots`` the slots it stands
    for (None: kept). ``next_slot`` is the slot to plan after it (aware UTC; None: none is
    planned), ``over`` whether its task's schedule ended with it (the task is disabled).
    ``misfire`` is the misfire policy's decision when the run was late, and ``plan_error`` why
    the schedule gave no next slot (a ``ScheduleError``; the run is decided as if on time).
    ``planned``: the slot after the run was planned before (a released buffered run), so none is
    planned now and none is missing.
    """

    kind: Kind
    status: str
    reason: str | None = None
    error: str = ""
    slots: int | None = None
    next_slot: datetime | None = None
    over: bool = False
    misfire: MisfireDecision | None = None
    plan_error: str = ""
    planned: bool = False


def decide(
    task: Any,
    *,
    trigger: str,
    slot: datetime,
    due: datetime | None,
    now: datetime,
    grace: timedelta,
    default_stale: float,
    load_error: str = "",
    pause: Any = None,
    in_batch: bool = False,
    busy_since: datetime | None = None,
    waiting: int = 0,
    released: bool = False,
) -> Decision:
    """Decide one claimed run of ``task`` (None: deleted) at ``slot`` with trigger ``trigger``.

    ``due`` is the run's jittered due moment (None: ``slot``), ``now`` the database clock at the
    decision, ``grace`` the default misfire grace period (a task's policy overrides it) and
    ``default_stale`` the default overlap staleness bound in seconds; all datetimes aware UTC.
    ``load_error`` says why the task's schedule could not be loaded (the run fails), ``pause``
    is the task's open ``Pause`` (anything with ``paused_by`` and ``why``) for a scheduled run.
    ``in_batch``: a run of the task was dispatched earlier in this claim; ``busy_since``: the
    newest dispatch of an unfinished run of the task. ``waiting``: how many other runs of the
    task wait (buffered, or released; in the ledger and in this claim); ``released``: this run
    was buffered and is pending again (its ``buffered_at`` is set). Raises nothing but what the
    schedule's maths raises besides ``ScheduleError`` (which becomes ``plan_error``).
    """
    ended = _ended(task, trigger, slot, load_error, pause)
    if ended is not None:
        return ended._replace(planned=released)
    if released:
        decision = Decision(Kind.DISPATCH, Run.Status.DISPATCHED, planned=True)
    elif trigger != Run.Trigger.SCHEDULE:
        decision = Decision(Kind.DISPATCH, Run.Status.DISPATCHED)
    elif task.one_off:
        decision = _one_off(task, slot, due, now, grace)
    else:
        decision = _periodic(task, slot, due, now, grace)
    if decision.kind != Kind.DISPATCH or trigger == Run.Trigger.MANUAL:
        return decision
    why = overlap(
        task, trigger, slot, in_batch=in_batch, busy_since=busy_since, now=now,
        default_stale=default_stale,
    )
    policy = getattr(task, "scheduling_policy", None)
    return _overlap(decision, policy, why, None if in_batch else busy_since,
                    waiting=int(waiting or 0), released=released)


def _overlap(
    decision: Decision, policy: Any, why: str, since: datetime | None, *, waiting: int,
    released: bool,
) -> Decision:
    """The overlap policy's say on a run the other rules dispatch: ``why`` is why the task is
    busy ("" when it is not, or the run is manual), ``since`` the busy run's dispatch (None: in
    this batch), ``waiting`` how many other runs of the task wait."""
    kind = TaskPolicy.Overlap.ALLOW if policy is None else policy.overlap_policy
    if kind == TaskPolicy.Overlap.REPLACE:
        return decision._replace(kind=Kind.REPLACE) if why or waiting else decision
    queued = kind == TaskPolicy.Overlap.BUFFER_ALL and waiting > 0 and not released
    if kind == TaskPolicy.Overlap.ALLOW or not why and not queued:
        return decision
    if kind == TaskPolicy.Overlap.SKIP:
        return decision._replace(kind=Kind.SKIP, status=Run.Status.SKIPPED, reason=why)
    full = None
    if not released and kind == TaskPolicy.Overlap.BUFFER_ONE and waiting:
        full = Run.Reason.buffer_full(since)
    elif not released and kind == TaskPolicy.Overlap.BUFFER_ALL and waiting >= policy.buffer_limit:
        full = Run.Reason.buffer_limit(policy.buffer_limit)
    if full is not None:
        return decision._replace(kind=Kind.SKIP, status=Run.Status.SKIPPED, reason=full)
    reason = Run.Reason.buffered(since) if why else Run.Reason.behind(waiting)
    return decision._replace(kind=Kind.BUFFER, status=Run.Status.BUFFERED, reason=reason)


def _ended(task: Any, trigger: str, slot: datetime, load_error: str, pause: Any) -> Decision | None:
    """The decision for a run that ends before any policy is asked; None for the others."""
    if load_error:
        return Decision(
            Kind.CLOSE, Run.Status.FAILED, Run.Reason.INVALID_SCHEDULE, error=load_error
        )
    if task is None:
        return Decision(Kind.CLOSE, Run.Status.CANCELLED, Run.Reason.TASK_DELETED)
    scheduled = trigger == Run.Trigger.SCHEDULE
    if scheduled and not task.enabled:
        return Decision(Kind.CLOSE, Run.Status.CANCELLED, Run.Reason.TASK_DISABLED)
    if scheduled and task.expires is not None and slot >= task.expires:
        return Decision(Kind.CLOSE, Run.Status.CANCELLED, Run.Reason.TASK_EXPIRED, over=True)
    if pause is not None:  # no dispatch, nothing planned until the resume
        return Decision(
            Kind.SKIP, Run.Status.SKIPPED, Run.Reason.paused(pause.paused_by, pause.why)
        )
    return None


def _one_off(
    task: Any, slot: datetime, due: datetime | None, now: datetime, grace: timedelta
) -> Decision:
    """A one-off's single run: dispatched (late: with why), or missed; its schedule ends."""
    late = one_off_misfire(task, slot, now, grace, due)
    if late is not None and not late.dispatches:
        return Decision(Kind.MISS, Run.Status.MISSED, late.reason, over=True, misfire=late)
    reason = late.reason if late is not None else None
    return Decision(Kind.DISPATCH, Run.Status.DISPATCHED, reason, over=True, misfire=late)


def _periodic(
    task: Any, slot: datetime, due: datetime | None, now: datetime, grace: timedelta
) -> Decision:
    """A periodic task's scheduled run: on time, or as its misfire policy says; plus the next
    slot."""
    try:
        late = misfire(task, slot, now, grace, due)
        nxt = slots.next_run(task, slot) if late is None else late.next_slot
    except ScheduleError as exc:
        return Decision(Kind.DISPATCH, Run.Status.DISPATCHED, plan_error=str(exc))
    if late is None:
        return Decision(Kind.DISPATCH, Run.Status.DISPATCHED, next_slot=nxt, over=nxt is None)
    if not late.dispatches:
        return Decision(
            Kind.MISS, Run.Status.MISSED, late.reason, next_slot=nxt, over=nxt is None,
            misfire=late,
        )
    return Decision(
        Kind.DISPATCH, Run.Status.DISPATCHED, late.reason, slots=late.slots, next_slot=nxt,
        over=nxt is None, misfire=late,
    )
