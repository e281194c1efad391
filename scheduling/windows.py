"""The time windows of the schedule health page: a range cut into whole, aligned buckets.

Pure functions of the range and the clock given (no database, no clock reads). A window's
buckets are aligned on multiples of their step since the Unix epoch (UTC): a 15-minute bucket
starts at :00, :15, :30 or :45, so a run lands in the same bucket on every reload. A preset
window (1 hour, 24 hours, 7 days) is the ``span / step`` buckets ending with the one holding
``now``; a custom range [since, until) is the buckets covering it. Either way only runs with
``start <= scheduled_for < end`` are counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

#: Most buckets of a window: the step is the first of ``STEPS`` that keeps to it.
MAX_BUCKETS = 120
MINUTE, HOUR, DAY = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
STEPS = tuple(MINUTE * m for m in (1, 2, 5, 10, 15, 30)) + tuple(
    HOUR * h for h in (1, 2, 3, 6, 12, 24)
) + tuple(DAY * d for d in (2, 7, 14, 28))
#: Axis ticks: the first of these giving at most ``MAX_TICKS`` ticks.
TICKS = tuple(MINUTE * m for m in (5, 10, 15, 30)) + tuple(
    HOUR * h for h in (1, 2, 3, 6, 12, 24)
) + tuple(DAY * d for d in (2, 7, 14, 28, 56))
MAX_TICKS = 8
#: The preset windows by key, in the order the page offers them: (span, label, "the last ...").
PRESETS: dict[str, tuple[timedelta, str, str]] = {
    "1h": (HOUR, "1 hour", "hour"),
    "24h": (DAY, "24 hours", "24 hours"),
    "7d": (DAY * 7, "7 days", "7 days"),
}
DEFAULT = "24h"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """Runs of [start, end) drawn in ``buckets`` buckets of ``step`` from ``origin``.

    ``origin <= start`` and ``origin + buckets * step >= end``; all aware UTC datetimes.
    ``key`` is the preset's key, or "custom"; ``label`` names the window for a title.
    """

    key: str
    label: str
    start: datetime
    end: datetime
    origin: datetime
    step: timedelta
    buckets: int

    @property
    def step_label(self) -> str:
        """The step in words: "1 minute", "15 minutes", "2 hours", "7 days"."""
        return duration_label(self.step)

    def bucket_start(self, index: int) -> datetime:
        """The start of bucket ``index`` (0 is the first)."""
        return self.origin + self.step * index

    def bucket_of(self, moment: datetime) -> int:
        """The index of the bucket holding ``moment`` (an aware datetime)."""
        return math.floor((moment - self.origin) / self.step)

    def ticks(self) -> list[tuple[int, datetime]]:
        """Axis ticks inside the window: (bucket index where the tick is, the tick's time).

        Every tick is a bucket boundary: a multiple since the epoch of the first step of
        ``TICKS`` that is a multiple of ``step`` and gives at most ``MAX_TICKS`` ticks.
        """
        span = self.step * self.buckets
        every = next(
            (t for t in TICKS if t % self.step == timedelta(0) and span / t <= MAX_TICKS),
            span,
        )
        first = _align_up(self.origin, every)
        found = []
        tick = first
        while tick < self.origin + span:
            if tick > self.origin:
                found.append((self.bucket_of(tick), tick))
            tick += every
        return found


def duration_label(duration: timedelta) -> str:
    """A whole number of minutes, hours or days in words: "1 minute", "2 hours", "7 days"."""
    for unit, name in ((DAY, "day"), (HOUR, "hour"), (MINUTE, "minute")):
        if duration % unit == timedelta(0):
            count = duration // unit
            return f"{count} {name}{'' if count == 1 else 's'}"
    return f"{duration.total_seconds():g} seconds"


def step_for(span: timedelta) -> timedelta:
    """The bucket step of a window of ``span``: the first of ``STEPS`` giving at most
    ``MAX_BUCKETS`` buckets (a span longer than that many of the largest gets whole days)."""
    for step in STEPS:
        if span / step <= MAX_BUCKETS:
            return step
    return DAY * math.ceil(span / (DAY * MAX_BUCKETS))


def preset(key: str, now: datetime) -> Window:
    """Return the preset window ``key`` (``PRESETS``) ending at ``now`` (an aware datetime).

    Its ``span / step`` buckets end with the one holding ``now``, so it starts less than one
    step after ``now - span``. Raises KeyError for an unknown key.
    """
    span, _button, last = PRESETS[key]
    step = step_for(span)
    now = now.astimezone(UTC)
    end_of_buckets = _align_up(now, step)
    if end_of_buckets == now:  # ``now`` on a boundary: its bucket is the one it starts
        end_of_buckets += step
    origin = end_of_buckets - span
    return Window(key, f"the last {last}", origin, now, origin, step, round(span / step))


def custom(since: datetime, until: datetime) -> Window:
    """Return the window of [since, until) (aware datetimes), in buckets covering it.

    Raises ValueError when ``until`` is not after ``since``.
    """
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    if until <= since:
        raise ValueError(f"the range ends ({until:%Y-%m-%d %H:%M:%S}) before it starts")
    step = step_for(until - since)
    origin = _align_down(since, step)
    buckets = math.ceil((until - origin) / step)
    label = f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC"
    return Window("custom", label, since, until, origin, step, buckets)


def _align_down(moment: datetime, step: timedelta) -> datetime:
    return _EPOCH + step * math.floor((moment - _EPOCH) / step)


def _align_up(moment: datetime, step: timedelta) -> datetime:
    return _EPOCH + step * math.ceil((moment - _EPOCH) / step)
