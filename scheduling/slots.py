"""Slot arithmetic: a schedule definition and a previous slot give the next slot.

Pure functions: no database, no clock reads. Every replica computes the same next slot from the
same definition and previous slot (invariant 6, docs/architecture.md), so the slot can be a
run's identity.
All datetimes taken and returned are aware; returned ones are in UTC.

Rules (docs/semantics.md):
- Interval: slots are ``anchor + k * every`` for k >= 0, where the anchor is ``start_time``
  when set, otherwise one interval after the task was created or last edited (``date_changed``).
- Crontab (``scheduling.cron``): evaluated in the crontab's own timezone. Day of month and day of week must both match
  (Celery's rule, which django-celery-beat rows follow). DST follows Vixie/ISC cron: a fixed-time
  job (no ``*`` in its minute or hour field) whose local time is skipped by a spring-forward runs
  once at the transition instant, and runs once (the first occurrence) when a fall-back repeats its
  local time; a job with a wildcard or stepped minute or hour field runs at every real instant whose
  local wall time matches, so it skips the missing hour and repeats in the repeated one.
- Clocked: one slot at ``clocked_time``.
- ``start_time``: no slot before it. ``expires``: no slot at or after it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from celery import schedules
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from scheduling.cron import MAX_SEARCH_DAYS, next_cron_instant, spec_for
from scheduling.exceptions import ScheduleError

#: Most slots counted one by one when coalescing; past it the count is a lower bound.
MAX_COUNTED_SLOTS = 10_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TICK = timedelta(microseconds=1)
_NAMESPACE = uuid.UUID("6f1c8a52-5d7e-4b7a-9a51-3c1f1e0b7d21")
#: 2**64 / golden ratio (Fibonacci hashing): task ids k apart get offsets frac(k / phi) apart.
_GOLDEN = 0x9E3779B97F4A7C15
_U64 = 2**64


def next_run(task: PeriodicTask, after: datetime) -> datetime | None:
    """Return the first slot of ``task`` strictly after ``after``, in UTC, or None if none is left.

    ``after`` is an aware datetime. None means the schedule is over: the clocked time has passed,
    or the next slot would fall at or after ``expires``.

    Raises ScheduleError when the schedule is missing or cannot produce a slot (interval of zero,
    a crontab that never matches, a solar schedule without the ``ephem`` package).
    """
    _require_aware(after, "after")
    if task.start_time is not None and after < task.start_time:
        after = task.start_time - _TICK
    try:
        slot = _next_slot(task, after)
    except OverflowError as exc:
        raise ScheduleError(f"the next slot of {task.name!r} is out of range: {exc}") from exc
    if slot is None:
        return None
    if task.expires is not None and slot >= task.expires:
        return None
    return slot


def slots_through(
    task: PeriodicTask, slot: datetime, until: datetime, cap: int = MAX_COUNTED_SLOTS
) -> tuple[int, datetime | None]:
    """Count the slots of ``task`` in ``(slot, until]`` and return ``(count, first slot > until)``.

    Used to coalesce a misfire: one dispatch stands for ``1 + count`` slots. An interval's count
    is exact arithmetic, stopped at ``cap``; other schedules are counted slot by slot, and stop at
    MAX_COUNTED_SLOTS whatever ``cap``. A stopped count is a lower bound, and the next slot is
    computed from ``until`` directly (for intervals exact arithmetic whatever the count).
    """
    interval = _interval_step(task)
    if interval is not None and task.interval_id is not None:
        if until <= slot:
            return 0, next_run(task, slot)
        count = (until - slot) // interval
        if task.expires is not None:
            # Only slots before expires count: at most ceil((expires - slot) / interval) - 1.
            count = max(0, min(count, -((slot - task.expires) // interval) - 1))
        try:
            following: datetime | None = slot + (count + 1) * interval
        except OverflowError as exc:
            raise ScheduleError(f"the next slot of {task.name!r} is out of range") from exc
        if task.expires is not None and following is not None and following >= task.expires:
            following = None
        return min(count, cap), following
    count = 0
    following = next_run(task, slot)
    while following is not None and following <= until:
        count += 1
        if count >= MAX_COUNTED_SLOTS:
            return count, next_run(task, until)
        following = next_run(task, following)
    return count, following


def slots_after(task: PeriodicTask, slot: datetime, count: int) -> list[datetime]:
    """Return the next ``count`` slots of ``task`` after ``slot``, in order (fewer if it ends).

    ``count`` >= 0. Used to record missed slots one ledger row each. Raises ScheduleError like
    ``next_run``.
    """
    found: list[datetime] = []
    current: datetime | None = slot
    while len(found) < count and current is not None:
        current = nth_slot_after(task, current, 1)
        if current is not None:
            found.append(current)
    return found


def nth_slot_after(task: PeriodicTask, slot: datetime, n: int) -> datetime | None:
    """Return the ``n``-th slot of ``task`` after ``slot`` (n >= 1), or None past its end.

    Intervals are computed directly (``slot + n * every`` on the task's grid); other schedules
    step through ``next_run`` n times. Raises ScheduleError like ``next_run``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    step = _interval_step(task)
    if step is not None:
        first = next_run(task, slot)
        if first is None:
            return None
        target = first + (n - 1) * step
        if task.expires is not None and target >= task.expires:
            return None
        return target
    current: datetime | None = slot
    for _ in range(n):
        if current is None:
            return None
        current = next_run(task, current)
    return current


def initial_run(
    task: PeriodicTask,
    now: datetime,
    *,
    last_slot: datetime | None,
    grace: timedelta,
) -> datetime | None:
    """Return the slot to plan for a task that has no pending run, or None.

    ``now`` is the database clock; ``last_slot`` is the latest scheduled run already in the ledger
    for this task (None if there is none). A slot is never planned at or before ``last_slot``, nor
    before the task was created or last edited (except an interval's ``start_time``, which is its
    first slot by definition), nor more than ``grace`` before ``now`` (older slots
    were missed while no replica ran; the misfire rules cover the ones inside the grace period). A
    clocked task's single slot is planned however old it is, unless it has run; the misfire policy
    then decides what happens to it.

    ``task.last_run_at`` is a previous run too (the ledger writes each dispatched slot there, and
    django-celery-beat's stock ``DatabaseScheduler`` the instant it sent a run):

    - no slot at or before it, and for an interval none less than one interval after it (stock
      beat's own next run is ``last_run_at + every``; the ledger's slots stay on the task's grid,
      so the first one is the first grid slot at or after ``last_run_at + every``);
    - a clocked one-off with no run in the ledger that stock beat already sent
      (``total_run_count`` above 0, or ``last_run_at`` at or after its clocked time: stock beat
      2.9 leaves a sent one-off enabled until its next tick) is over: None, as stock beat itself
      would disable it on that tick without sending it again;
    - switching from stock beat (``last_slot`` is None, ``last_run_at`` set): the first slot after
      it is planned however old it is, not only from ``now - grace``, so a slot that fell while
      no scheduler ran is not dropped silently: the claim applies the task's misfire policy to
      it (coalesce: dispatched once at once, standing for every missed slot; skip: recorded
      missed; catch_up: replayed, capped). A slot stock beat already sent is never sent again.
    """
    if task.clocked_id is not None:
        if last_slot is None and _stock_sent_one_off(task):
            return None  # switching from stock beat, which already sent this one-off
        # One slot per clocked time: a re-armed one-off (a new clocked time) runs again.
        return next_run(task, last_slot or _EPOCH)
    if task.one_off and last_slot is not None and (
        task.date_changed is None or task.date_changed <= last_slot
    ):
        return None  # a one-off that has run, and was not edited (re-armed) since
    previous = task.last_run_at
    step = _interval_step(task)
    if previous is not None and step is not None:
        try:
            previous += step - _TICK
        except OverflowError as exc:
            raise ScheduleError(f"the next slot of {task.name!r} is out of range") from exc
    if last_slot is None and previous is not None:
        floor = previous  # switching from stock beat: its last run is the previous slot
    else:
        floor = max(f for f in (now - grace, last_slot, previous) if f is not None)
    if task.date_changed is not None and task.date_changed > floor:
        if task.interval_id is not None and task.start_time is not None and task.start_time > floor:
            # An interval's start_time is its first slot, even when the task was saved just after
            # it; any later slot of an edited (re-enabled) task comes after the edit.
            return next_run(task, floor)
        floor = task.date_changed
    return next_run(task, floor)


def _stock_sent_one_off(task: PeriodicTask) -> bool:
    """Return whether django-celery-beat's stock scheduler already sent this clocked one-off.

    Stock beat counts each send in ``total_run_count`` and stamps ``last_run_at``; on its next tick
    it disables a one-off whose count is above 0 and resets the count (``ModelEntry.is_due``),
    and a disabled task's ``save()`` clears ``last_run_at``. So a count above 0, or a
    ``last_run_at`` at or after the clocked time, is a send; a one-off re-armed the stock way
    (disabled, then enabled with a new clocked time) has neither.
    """
    if task.total_run_count:
        return True
    return task.last_run_at is not None and task.last_run_at >= task.clocked.clocked_time


def task_id_for(periodic_task_id: int, scheduled_for: datetime, trigger: str = "schedule") -> str:
    """Return the deterministic Celery task id of a scheduled run (a UUID5 string).

    Every replica derives the same id for (periodic task id, slot), so a run re-published after a
    crash carries the id of the first publish (invariant 2, docs/architecture.md). A backfill run
    of the same slot (``trigger="backfill"``) gets an id of its own.
    """
    stamp = scheduled_for.astimezone(UTC).isoformat(timespec="microseconds")
    prefix = "" if trigger == "schedule" else f"{trigger}:"
    return str(uuid.uuid5(_NAMESPACE, f"{prefix}{periodic_task_id}@{stamp}"))


def jitter_offset(
    periodic_task_id: int, slot: datetime, jitter: timedelta, cap: timedelta | None = None
) -> timedelta:
    """Return the stable jitter offset of a task's slot, in ``[0, min(jitter, cap))``.

    Derived from (periodic task id, slot) only, so every replica computes the same one: the
    fraction ``(id * 2**64/phi + blake2b64(slot)) mod 2**64 / 2**64`` of the bound, to the
    microsecond. Over the slots of one task the slot's hash spreads the offsets uniformly; tasks
    sharing a slot (a crontab many tasks use) are placed by their ids along the golden-ratio
    (Weyl) sequence, so even a thousand tasks created together land evenly across the bound, not
    by chance. ``cap`` is the gap to the next slot (``due_moment``): a run never moves past it.
    A bound of zero or less gives no offset.
    """
    bound = jitter if cap is None else min(jitter, cap)
    micros = bound // _TICK
    if micros <= 0:
        return timedelta(0)
    stamp = slot.astimezone(UTC).isoformat(timespec="microseconds")
    spread = int.from_bytes(hashlib.blake2b(stamp.encode(), digest_size=8).digest(), "big")
    fraction = (periodic_task_id * _GOLDEN + spread) % _U64
    return timedelta(microseconds=(fraction * micros) >> 64)


def due_moment(task: PeriodicTask, slot: datetime, jitter_seconds: float) -> datetime:
    """Return when the run of ``task`` at ``slot`` is due: the slot plus its jitter offset (UTC).

    The offset (``jitter_offset``) is capped at the gap to the task's next slot, so a jittered
    run is due before the next slot (an interval's period; a crontab's gap from this match to
    the next); a slot with no next one (clocked, the last before ``expires``) is capped at
    ``jitter_seconds`` only. ``slot`` stays the run's identity (``task_id_for``).

    Raises ScheduleError like ``next_run`` (only when ``jitter_seconds`` > 0).
    """
    if jitter_seconds <= 0:
        return slot
    following = next_run(task, slot)
    cap = None if following is None else following - slot
    return slot + jitter_offset(task.pk, slot, timedelta(seconds=jitter_seconds), cap)


def slots_between(task: PeriodicTask, since: datetime, until: datetime) -> Iterator[datetime]:
    """Yield the slots of ``task`` in ``[since, until)``, in order (``next_run`` chaining).

    Raises ScheduleError when the schedule cannot produce a slot.
    """
    _require_aware(since, "since")
    _require_aware(until, "until")
    slot = next_run(task, since - _TICK)
    while slot is not None and slot < until:
        yield slot
        slot = next_run(task, slot)


def _next_slot(task: PeriodicTask, after: datetime) -> datetime | None:
    if task.interval_id is not None:
        return _next_interval(task, after)
    if task.crontab_id is not None:
        return next_crontab(task.crontab, after)
    if task.clocked_id is not None:
        clocked_time = task.clocked.clocked_time
        return clocked_time.astimezone(UTC) if clocked_time > after else None
    if task.solar_id is not None:
        return _next_solar(task, after)
    raise ScheduleError(f"periodic task {task.name!r} has no schedule (interval, crontab, ...)")


# Interval ---------------------------------------------------------------------------------------


def _interval_step(task: PeriodicTask) -> timedelta | None:
    if task.interval_id is None:
        return None
    interval: IntervalSchedule = task.interval
    try:
        step = timedelta(**{interval.period: interval.every})
    except (TypeError, OverflowError) as exc:
        raise ScheduleError(f"interval {interval.every} {interval.period} is invalid") from exc
    if step <= timedelta(0):
        raise ScheduleError(f"interval must be positive, got {interval.every} {interval.period}")
    return step


def _next_interval(task: PeriodicTask, after: datetime) -> datetime:
    step = _interval_step(task)
    assert step is not None
    if task.start_time is not None:
        anchor = task.start_time
    elif task.date_changed is not None:
        anchor = task.date_changed + step
    else:
        raise ScheduleError(f"interval task {task.name!r} has neither start_time nor date_changed")
    anchor = anchor.astimezone(UTC)
    if after < anchor:
        return anchor
    return anchor + ((after - anchor) // step + 1) * step


# Crontab ----------------------------------------------------------------------------------------


def next_crontab(crontab: CrontabSchedule, after: datetime) -> datetime:
    """Return the first instant strictly after ``after`` at which ``crontab`` fires, in UTC.

    Raises ScheduleError if the crontab is invalid or matches no day in MAX_SEARCH_DAYS.
    """
    spec = spec_for(
        str(crontab.minute), str(crontab.hour), str(crontab.day_of_month),
        str(crontab.month_of_year), str(crontab.day_of_week),
    )
    return next_cron_instant(spec, ZoneInfo(str(crontab.timezone)), after, MAX_SEARCH_DAYS)


# Solar ------------------------------------------------------------------------------------------


def _next_solar(task: PeriodicTask, after: datetime) -> datetime:
    try:
        import ephem  # noqa: F401
    except ImportError as exc:
        raise ScheduleError(
            "solar schedules need the 'ephem' package: pip install ephem"
        ) from exc
    solar = task.solar
    sched = schedules.solar(solar.event, float(solar.latitude), float(solar.longitude))

    def event_after(moment: datetime) -> datetime:
        sched.nowfun = lambda: moment
        return (moment + sched.remaining_estimate(moment)).astimezone(UTC)

    # ephem's event times carry microseconds of float noise that depend on the starting moment,
    # so two replicas would compute different slots (and task ids) for one sunrise. Slots are
    # the event rounded to the whole second; the event itself is only accurate to about a minute.
    event = event_after(after)
    slot = _round_to_second(event)
    if slot <= after:  # rounded down onto the slot just dispatched: this event is done
        slot = _round_to_second(event_after(event + timedelta(seconds=1)))
    return slot


def _round_to_second(moment: datetime) -> datetime:
    return (moment + timedelta(microseconds=500_000)).replace(microsecond=0)


def _require_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got {value!r}")

