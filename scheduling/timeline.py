"""The schedule health page's data: per periodic task, its runs in a window, counted and drawn.

A window (``scheduling.windows``: the last hour, 24 hours, 7 days, or a custom range) is cut
into aligned buckets. Per task, each bucket is one column of the chart holding a stacked
segment per outcome present (``scheduling.outcomes``): no mark covers another, every outcome
present keeps at least ``MIN_SEGMENT`` pixels and the rest of the column is shared in
proportion to the runs, so the majority outcome is the largest segment. Scheduled runs are drawn
in the task's main lane; manual runs and backfills in a lane of their own below it, and their
lateness (late by design) is in no tooltip and no statistic. The count columns add up to the
runs count (every status has one); p95 and max lateness cover dispatched scheduled runs.

Everything is aggregated in SQL (``sql/queries.sql``: ``health_counts``, ``health_lateness``,
``health_buckets``) and bounded whatever the ledger's size: one page of ``TASKS_PER_PAGE``
tasks, and one row per (task, bucket, trigger, status), at most ``windows.MAX_BUCKETS``
buckets. Times are aware UTC datetimes from the database clock; lateness is in seconds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import Exists, OuterRef, Q
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django_celery_beat.models import PeriodicTask

from scheduling.models import Run
from scheduling.outcomes import OUTCOMES, Outcome, outcome_of
from scheduling.sql import queries
from scheduling.windows import Window

TASKS_PER_PAGE = 50
#: Width of the chart in pixels; height of the scheduled lane and of the manual/backfill lane.
CHART_WIDTH = 840
LANE_HEIGHT = 20
OTHER_LANE_HEIGHT = 10
LANE_GAP = 3
#: Every outcome present in a column keeps at least this many pixels of it.
MIN_SEGMENT = 3.0
SCHEDULED = "scheduled"
OTHER = "other"


def stack(counts: list[int], height: float, minimum: float = MIN_SEGMENT) -> list[float]:
    """Split ``height`` pixels among ``counts`` (each > 0): each gets at least ``minimum``,
    the rest in proportion to its count; equal shares when the minimums do not fit.

    Returns one height per count, summing to ``height``: the largest count has the largest.
    """
    if not counts:
        return []
    if minimum * len(counts) >= height:
        return [height / len(counts)] * len(counts)
    spare, total = height - minimum * len(counts), sum(counts)
    return [minimum + spare * n / total for n in counts]


def _span(start: datetime, end: datetime) -> str:
    """A bucket's range for a tooltip: the end's date only when it is another day's."""
    if (end - timedelta(microseconds=1)).date() == start.date():
        return f"{start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M}-{end:%Y-%m-%d %H:%M} UTC"


@dataclass
class Segment:
    """The runs of one task, bucket, lane and outcome; ``runs`` of them, per trigger in
    ``triggers``; lateness in seconds (scheduled runs only); pixel box set by ``Column``."""

    outcome: Outcome
    runs: int = 0
    first: datetime | None = None
    last: datetime | None = None
    max_lateness: float | None = None
    detail: str = ""
    triggers: dict[str, int] = field(default_factory=dict)
    title: str = ""
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def add(self, item: _BucketRow) -> None:
        """Stand also for the runs of ``item`` (another status or trigger of this outcome)."""
        self.runs += item.runs
        self.triggers[item.trigger] = self.triggers.get(item.trigger, 0) + item.runs
        self.first = item.first if self.first is None else min(self.first, item.first)
        self.last = item.last if self.last is None else max(self.last, item.last)
        if item.lateness is not None and item.trigger == Run.Trigger.SCHEDULE:
            self.max_lateness = max(self.max_lateness or 0.0, item.lateness)
        self.detail = self.detail or item.detail

    @property
    def svg(self) -> SafeString:
        """The segment's ``<rect>`` in its box (pixels)."""
        x, y, width, height = self.box
        return format_html(
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>',
            f"{x:.2f}", f"{y:.2f}", f"{width:.2f}", f"{height:.2f}", self.outcome.colour,
        )


@dataclass
class Column:
    """One bucket of one lane of a task: its segments, bottom to top in ``OUTCOMES`` order."""

    lane: str
    bucket: int
    start: datetime
    end: datetime
    segments: dict[str, Segment] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return sum(segment.runs for segment in self.segments.values())

    def ordered(self) -> list[Segment]:
        return [self.segments[o.key] for o in OUTCOMES if o.key in self.segments]

    def lay_out(self, x: float, width: float, top: float, height: float) -> None:
        """Give each segment its box in the column's box and its tooltip."""
        segments = self.ordered()
        bottom = top + height
        for segment, size in zip(segments, stack([s.runs for s in segments], height), strict=True):
            bottom -= size
            segment.box = (x, bottom, width, size)
            segment.title = self._title(segment, segments)

    def _title(self, segment: Segment, segments: list[Segment]) -> str:
        assert segment.first is not None and segment.last is not None
        label = segment.outcome.label
        if segment.runs == 1:
            parts = [f"{segment.first:%Y-%m-%d %H:%M:%S} UTC"]
        else:
            parts = [_span(self.start, self.end)]
        if self.lane == OTHER:
            triggers = ", ".join(f"{n} {t}" for t, n in sorted(segment.triggers.items()))
            parts.append(f"{segment.runs} {label} ({triggers}; not counted in lateness)")
        else:
            parts.append(f"{segment.runs} {label}")
        if len(segments) > 1:
            shares = ", ".join(f"{s.runs} {s.outcome.label}" for s in segments)
            parts[-1] += f" of {self.runs} runs here ({shares})"
        if segment.max_lateness is not None:
            late = "lateness" if segment.runs == 1 else "max lateness"
            parts.append(f"{late} {segment.max_lateness:.3f} s")
        if segment.detail:  # the reason or error of the run; of one of them for several
            parts.append(segment.detail if segment.runs == 1 else f"e.g. {segment.detail}")
        return " · ".join(parts)


@dataclass
class TaskRow:
    """One periodic task: runs per outcome key, per trigger, lateness of scheduled runs (s)."""

    task_id: int
    name: str
    enabled: bool
    counts: dict[str, int] = field(default_factory=dict)
    triggers: dict[str, int] = field(default_factory=dict)
    total: int = 0
    p95_lateness: float | None = None
    max_lateness: float | None = None
    columns: dict[tuple[str, int], Column] = field(default_factory=dict)

    @property
    def outcome_counts(self) -> list[tuple[Outcome, int]]:
        """(outcome, runs) for every outcome, in column order: they add up to ``total``."""
        return [(outcome, self.counts.get(outcome.key, 0)) for outcome in OUTCOMES]

    @property
    def manual(self) -> int:
        return self.triggers.get(Run.Trigger.MANUAL, 0)

    @property
    def backfill(self) -> int:
        return self.triggers.get(Run.Trigger.BACKFILL, 0)

    @property
    def has_other_lane(self) -> bool:
        return any(lane == OTHER for lane, _bucket in self.columns)

    @property
    def bands(self) -> list[tuple[float, int]]:
        """The lanes' backgrounds: (y, height) in pixels, around each lane's columns."""
        bands = [(0.5, LANE_HEIGHT + 1)]
        if self.has_other_lane:
            bands.append((LANE_HEIGHT + LANE_GAP + 0.5, OTHER_LANE_HEIGHT + 1))
        return bands

    @property
    def chart_height(self) -> int:
        """The row's chart height in pixels: the scheduled lane, and the other one if used."""
        extra = LANE_GAP + OTHER_LANE_HEIGHT if self.has_other_lane else 0
        return LANE_HEIGHT + extra + 2

    @property
    def segments(self) -> list[tuple[Column, Segment]]:
        """Every (column, segment) of the chart, lane by lane, bucket by bucket."""
        return [
            (column, segment)
            for _key, column in sorted(self.columns.items())
            for segment in column.ordered()
        ]


@dataclass
class Timeline:
    """The page: its window, one page of task rows, the axis ticks (x in pixels, label)."""

    window: Window
    page: Page
    rows: list[TaskRow]
    ticks: list[tuple[float, str]]

    @property
    def bucket_width(self) -> float:
        return CHART_WIDTH / self.window.buckets


@dataclass(frozen=True)
class _BucketRow:
    task_id: int
    bucket: int
    trigger: str
    status: str
    runs: int
    first: datetime
    last: datetime
    lateness: float | None
    detail: str


def build(window: Window, page_number: int | str | None = 1) -> Timeline:
    """Return the timeline of ``window`` (``scheduling.windows``): one page of task rows.

    Rows are the periodic tasks that are enabled or have a run in the window, by name, one page
    of ``TASKS_PER_PAGE``; a page number out of range gives the last page. Four queries
    whatever the number of runs, each bounded by the page's tasks and the window's buckets.
    """
    in_window = Run.objects.filter(
        scheduled_for__gte=window.start, scheduled_for__lt=window.end
    )
    tasks = (
        PeriodicTask.objects.filter(
            Q(enabled=True) | Exists(in_window.filter(periodic_task=OuterRef("pk")))
        )
        .order_by("name", "pk")
        .values_list("pk", "name", "enabled")
    )
    page = Paginator(tasks, TASKS_PER_PAGE).get_page(page_number)
    rows = {pk: TaskRow(pk, name, enabled) for pk, name, enabled in page.object_list}
    params = {"tasks": list(rows), "start": window.start, "end": window.end}
    with connection.cursor() as cursor:
        cursor.execute(queries["health_counts"], params)
        for task_id, trigger, status, runs in cursor.fetchall():
            row = rows[task_id]
            key = outcome_of(status).key
            row.counts[key] = row.counts.get(key, 0) + runs
            row.triggers[trigger] = row.triggers.get(trigger, 0) + runs
            row.total += runs
        cursor.execute(queries["health_lateness"], params)
        for task_id, p95, worst in cursor.fetchall():
            rows[task_id].p95_lateness, rows[task_id].max_lateness = p95, worst
        cursor.execute(
            queries["health_buckets"],
            {**params, "origin": window.origin, "step": window.step.total_seconds()},
        )
        buckets = [_BucketRow(*item[:-1], item[-1] or "") for item in cursor.fetchall()]
    _add_columns(rows, buckets, window)
    return Timeline(window, page, list(rows.values()), _ticks(window))


def _add_columns(rows: dict[int, TaskRow], buckets: list[_BucketRow], window: Window) -> None:
    by_column: dict[tuple[int, str, int], list[_BucketRow]] = defaultdict(list)
    for item in buckets:
        lane = SCHEDULED if item.trigger == Run.Trigger.SCHEDULE else OTHER
        by_column[(item.task_id, lane, item.bucket)].append(item)
    width = CHART_WIDTH / window.buckets
    gap = 1.0 if width >= 4 else 0.0
    for (task_id, lane, bucket), items in by_column.items():
        column = Column(
            lane, bucket, window.bucket_start(bucket), window.bucket_start(bucket + 1)
        )
        for item in items:
            outcome = outcome_of(item.status)
            column.segments.setdefault(outcome.key, Segment(outcome)).add(item)
        top, height = (1.0, LANE_HEIGHT) if lane == SCHEDULED else (
            1.0 + LANE_HEIGHT + LANE_GAP, OTHER_LANE_HEIGHT
        )
        column.lay_out(bucket * width + gap / 2, width - gap, top, height)
        rows[task_id].columns[(lane, bucket)] = column


def _ticks(window: Window) -> list[tuple[float, str]]:
    """Axis ticks: (x in pixels, "HH:MM", or "Mon 30" for ticks a day or more apart)."""
    ticks = window.ticks()
    daily = len(ticks) > 1 and (ticks[1][1] - ticks[0][1]).total_seconds() >= 86400
    width = CHART_WIDTH / window.buckets
    return [
        (index * width, f"{moment:%a %d}" if daily else f"{moment:%H:%M}")
        for index, moment in ticks
    ]
