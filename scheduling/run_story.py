"""A run's story for its admin page: what happened to it, in order, to the millisecond.

Pure: reads the run's own columns (and its ``events``), no query and no clock. Each moment is
shown in UTC and in the task's zone (``upcoming.task_zone``: a crontab's zone, else the site's
``TIME_ZONE``; UTC for a run whose task was deleted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from scheduling.models import Run
from scheduling.upcoming import task_zone

#: What each event kind of ``Run.events`` is called on the timeline.
EVENT_LABELS = {"republished": "re-published", "recovered": "re-published (recovered)",
                "retry": "retried"}


@dataclass(frozen=True)
class Moment:
    """One line of a run's timeline: ``what`` happened at ``at`` (aware), with ``detail``."""

    what: str
    at: datetime
    detail: str = ""

    def utc(self) -> str:
        """``2026-11-30 05:40:44.218`` (UTC, to the millisecond)."""
        return _ms(self.at.astimezone(UTC))

    def local(self, zone: ZoneInfo) -> str:
        """The same instant in ``zone`` to the millisecond, with its abbreviation."""
        moment = self.at.astimezone(zone)
        return f"{_ms(moment)} {moment:%Z}"


@dataclass(frozen=True)
class Story:
    """A run's timeline (``moments`` in time order), its zone and its figures, for the page."""

    moments: tuple[Moment, ...]
    zone: ZoneInfo
    lateness: timedelta | None
    runtime: timedelta | None
    deliveries: int
    #: Attempts started (1 + the retries recorded with their start); ``runtime`` is the last's.
    attempts: int = 1
    #: Why ``lateness`` is None for a dispatched run ("" when it is measured).
    unmeasured: str = ""


def story(run: Run) -> Story:
    """Return ``run``'s story: scheduled, due (when jitter moved it), planned, dispatched (by
    which replica, how late), each re-publish, each attempt's start (on which worker), each
    Celery retry, and its end (status, reason), sorted by time; moments the run did not reach
    are left out.

    ``deliveries`` counts the messages published for it: the dispatch and each re-publish. A
    backfill's lateness is not measured (its slot is in the past by design: the health page
    leaves it out too).
    """
    moments = [Moment("scheduled", run.scheduled_for, f"the slot ({run.trigger})")]
    if run.due_at is not None and run.due_at != run.scheduled_for:
        offset = (run.due_at - run.scheduled_for).total_seconds()
        moments.append(Moment("due", run.due_at, f"jitter {offset:+.3f} s"))
    if run.planned_at is not None:
        moments.append(Moment("planned", run.planned_at, "the run's row written"))
    if run.dispatched_at is not None:
        late = run.lateness.total_seconds() if run.lateness is not None else 0.0
        moments.append(Moment(
            "claimed and dispatched", run.dispatched_at,
            f"by replica {run.claimed_by or '-'}, {late:.3f} s after it was due",
        ))
    attempts = _events(run, moments)
    if run.started_at is not None:
        moments.append(Moment("started", run.started_at, _on(attempts, run.worker)))
    if run.finished_at is not None:
        moments.append(Moment(f"ended {run.status}", run.finished_at, run.reason))
    # By time; two moments at the same instant keep the order above (a run's life).
    ordered = tuple(m for _, m in sorted(enumerate(moments), key=lambda p: (p[1].at, p[0])))
    deliveries = 0 if run.dispatched_at is None else 1 + run.republished
    backfill = run.trigger == Run.Trigger.BACKFILL and run.dispatched_at is not None
    return Story(ordered, _zone(run), None if backfill else run.lateness, run.runtime,
                 deliveries, attempts, "a backfill of a past slot" if backfill else "")


def _events(run: Run, moments: list[Moment]) -> int:
    """Append ``run``'s events to ``moments``, with the start of each retried attempt the event
    recorded; return the number of the attempt the run's own ``started_at`` is (1 without
    retries)."""
    attempt = 1
    for event in run.events or ():
        if event.get("started"):  # a retry event: the attempt's own start, then its retry
            moments.append(Moment("started", datetime.fromisoformat(event["started"]),
                                  _on(attempt, event.get("worker"))))
            attempt += 1
        at = datetime.fromisoformat(event["at"])
        moments.append(Moment(EVENT_LABELS.get(event["kind"], event["kind"]), at,
                              event.get("detail", "")))
    return attempt


def _on(attempt: int, worker: str | None) -> str:
    where = f"on worker {worker or '-'}"
    return where if attempt == 1 else f"attempt {attempt} {where}"


def _zone(run: Run) -> ZoneInfo:
    if run.periodic_task_id is None:
        return ZoneInfo("UTC")
    try:
        return task_zone(run.periodic_task)
    except LookupError:  # a crontab zone zoneinfo does not know
        return ZoneInfo("UTC")


def _ms(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
