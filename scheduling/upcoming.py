"""Upcoming runs: the next slots of a periodic task, for people, from ``slots.next_run``.

Pure: no database and no clock reads; the caller passes ``after`` (the database clock for a saved
task, ``ledger.database_now``). The slots are the scheduler's own (``slots.next_run`` chained, the
same code that plans each run), so what a person is shown is what will be planned. Each slot is
given in UTC and in the task's own time zone (a crontab's ``timezone`` field, the site's
``TIME_ZONE`` otherwise) with its UTC offset, so a DST change between two slots shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from scheduling import slots
from scheduling.timeformat import utc_text

#: Slots shown by default: the admin page, the form's preview.
DEFAULT_COUNT = 10


@dataclass(frozen=True)
class UpcomingRun:
    """One upcoming slot: ``slot`` (aware, UTC) and ``local`` (the same instant in ``zone``).

    ``offset_change`` is ``(offset before, offset after)`` when the zone's UTC offset differs from
    the previous slot's (for the first slot: from ``after``'s), a DST change in between; else None.
    """

    slot: datetime
    local: datetime
    zone: str
    offset_change: tuple[timedelta, timedelta] | None = None

    @property
    def offset(self) -> str:
        """The local UTC offset as ``+01:00``."""
        return format_offset(self.local.utcoffset() or timedelta(0))

    @property
    def utc_text(self) -> str:
        """The slot in UTC to the second, with the zone: ``2027-03-28 01:00:00 UTC``
        (``timeformat.utc_text``)."""
        return utc_text(self.slot, "s")

    @property
    def local_text(self) -> str:
        """The slot in its zone with the zone's abbreviation: ``2027-03-28 03:00:00 CEST``."""
        return f"{self.local:%Y-%m-%d %H:%M:%S %Z}"

    @property
    def dst_note(self) -> str:
        """``"DST change: UTC offset +01:00 -> +02:00"``, or "" when the offset did not change."""
        if self.offset_change is None:
            return ""
        before, after = (format_offset(offset) for offset in self.offset_change)
        return f"DST change: UTC offset {before} -> {after}"

    def describe(self) -> str:
        """One line: the slot in UTC, then in its zone unless that is UTC, then the DST note.

        ``2027-03-28 01:00:00 UTC (2027-03-28 03:00:00 CEST Europe/Berlin; DST change: UTC
        offset +01:00 -> +02:00)``; ``2026-01-05 10:00:00 UTC`` for a task in UTC.
        """
        notes = [] if self.zone == "UTC" else [f"{self.local_text} {self.zone}"]
        if self.dst_note:
            notes.append(self.dst_note)
        words = self.utc_text
        return f"{words} ({'; '.join(notes)})" if notes else words

    def as_json(self) -> dict[str, object]:
        """``{"slot": ISO UTC, "local": ISO with offset, "time_zone", "offset_change"}``.

        ``offset_change`` is ``["+01:00", "+02:00"]`` when a DST change comes before this slot,
        else None.
        """
        change = self.offset_change
        return {
            "slot": self.slot.isoformat(),
            "local": self.local.isoformat(),
            "time_zone": self.zone,
            "offset_change": None if change is None else [format_offset(o) for o in change],
        }


def upcoming_slots(task: PeriodicTask, after: datetime, count: int = DEFAULT_COUNT) -> list[datetime]:
    """Return the next ``count`` slots of ``task`` strictly after ``after``: aware, UTC, in order.

    ``slots.next_run`` chained from ``after`` (an aware datetime), fewer when the schedule ends
    (clocked time passed, ``expires``). A disabled task has none; a one-off task (a clocked one
    included) at most one. Raises ValueError for a negative ``count`` and ScheduleError when the
    schedule cannot give a slot (``slots.next_run``).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not task.enabled:
        return []
    if task.one_off:
        count = min(count, 1)
    found: list[datetime] = []
    current = after
    while len(found) < count:
        following = slots.next_run(task, current)
        if following is None:
            break
        found.append(following)
        current = following
    return found


def upcoming_runs(
    task: PeriodicTask, after: datetime, count: int = DEFAULT_COUNT
) -> list[UpcomingRun]:
    """Return ``upcoming_slots(task, after, count)`` with each slot in the task's own time zone.

    Same errors as ``upcoming_slots``.
    """
    zone = task_zone(task)
    previous = (after.astimezone(zone).utcoffset() or timedelta(0))
    runs = []
    for slot in upcoming_slots(task, after, count):
        local = slot.astimezone(zone)
        offset = local.utcoffset() or timedelta(0)
        change = (previous, offset) if offset != previous else None
        runs.append(UpcomingRun(slot, local, str(zone), change))
        previous = offset
    return runs


def task_zone(task: PeriodicTask) -> ZoneInfo:
    """Return the zone a task's slots are read in: its crontab's, else the site's TIME_ZONE.

    Raises ZoneInfoNotFoundError for a crontab whose time zone is unknown.
    """
    if task.crontab_id is not None:
        return ZoneInfo(str(task.crontab.timezone))
    default = timezone.get_default_timezone()
    return default if isinstance(default, ZoneInfo) else ZoneInfo(str(default))


def format_offset(offset: timedelta) -> str:
    """A UTC offset as ``+01:00`` / ``-04:00`` (``+05:30`` for Asia/Kolkata)."""
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"
