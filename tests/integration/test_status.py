"""``manage.py scheduling_status`` on a seeded ledger: exact cells in every format."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import SolarSchedule

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.conftest import utc
from tests.integration.conftest import GRACE

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = utc(2026, 1, 5, 10, 0)


def _run(task, status: str, slot, *, late: float | None = None, **fields) -> Run:
    return Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        status=status, task_id=str(uuid.uuid4()),
        dispatched_at=None if late is None else slot + timedelta(seconds=late), **fields,
    )


@pytest.fixture
def seeded(make_task):
    every = make_task(every=5, name="a: every 5 s")
    _run(every, Run.Status.SUCCEEDED, SLOT, late=0.25)
    _run(every, Run.Status.SUCCEEDED, SLOT + timedelta(seconds=5), late=0.0125)
    _run(every, Run.Status.CANCELLED, SLOT + timedelta(seconds=10))
    _run(every, Run.Status.PENDING, SLOT + timedelta(seconds=10))
    _run(every, Run.Status.PENDING, SLOT + timedelta(hours=1), trigger=Run.Trigger.MANUAL)

    weekly = make_task(cron="0 9 * * 1", timezone="Europe/Berlin", name="b: weekly")
    _run(weekly, Run.Status.DISPATCHED, SLOT - timedelta(days=7), late=1.5)
    _run(weekly, Run.Status.FAILED, SLOT, error="boom")  # rejected: never dispatched
    # A backfill run dispatched later does not count for lateness; its slot is older.
    _run(weekly, Run.Status.SUCCEEDED, SLOT - timedelta(days=14), late=86400 * 20,
         trigger=Run.Trigger.BACKFILL)
    # Waiting behind the dispatched run (overlap policy buffer_one): counted, not the last run.
    _run(weekly, Run.Status.BUFFERED, SLOT - timedelta(days=21), buffered_at=SLOT)
    _policy(weekly, TaskPolicy.Overlap.BUFFER_ONE)

    clocked = make_task(clocked=SLOT, name="c: one-off", enabled=False)
    _run(clocked, Run.Status.MISSED, SLOT)
    _policy(clocked, TaskPolicy.Overlap.SKIP)

    never = make_task(every=1, period="minutes", name="d: never ran", one_off=True)
    _policy(never, TaskPolicy.Overlap.BUFFER_ALL, buffer_limit=7)
    solar = SolarSchedule.objects.create(event="sunrise", latitude=51.5, longitude=-0.12)
    _policy(make_task(name="e: solar", solar=solar), TaskPolicy.Overlap.REPLACE,
            replace_started=TaskPolicy.ReplaceStarted.TERMINATE)


def _policy(task, overlap: str, **fields) -> TaskPolicy:
    return TaskPolicy.objects.create(periodic_task=task, overlap_policy=overlap, **fields)


EXPECTED = [
    ("a: every 5 s", "every 5 seconds", "yes", "-", "2026-01-05 10:00:10 UTC",
     "2026-01-05 10:00:05 UTC", "succeeded", "0.013 s", "0", "allow"),
    ("b: weekly", "At 09:00, only on Monday (Europe/Berlin)", "yes", "-", "-",
     "2026-01-05 10:00:00 UTC", "failed", "1.500 s", "1", "buffer one"),
    ("c: one-off", "once at 2026-01-05 10:00:00 UTC", "no", "-", "-", "2026-01-05 10:00:00 UTC",
     "missed", "-", "0", "skip"),
    ("d: never ran", "every minute, once", "yes", "-", "-", "-", "-", "-", "0",
     "buffer all (limit 7)"),
    ("e: solar", "Sunrise at 51.5, -0.12", "yes", "-", "-", "-", "-", "-", "0",
     "replace (terminate)"),
]
HEADER = (
    "Task", "Schedule", "Enabled", "Paused", "Next run", "Last run", "Outcome", "Lateness",
    "Buffered", "Overlap",
)


def _status(*args: str) -> str:
    out = StringIO()
    call_command("scheduling_status", *args, stdout=out)
    return out.getvalue()


def test_status_plain_has_exact_cells(seeded):
    lines = _status("--format", "plain").splitlines()
    assert [tuple(line.split("\t")) for line in lines] == [HEADER, *EXPECTED]


def test_status_json(seeded):
    rows = json.loads(_status("--format", "json"))
    assert rows[0] == {
        "name": "a: every 5 s",
        "schedule": "every 5 seconds",
        "enabled": True,
        "paused": None,
        "next_run": "2026-01-05T10:00:10+00:00",
        "last_run": "2026-01-05T10:00:05+00:00",
        "last_status": "succeeded",
        "lateness_seconds": 0.0125,
        "buffered": 0,
        "overlap": "allow",
    }
    assert [
        (r["name"], r["last_status"], r["lateness_seconds"], r["buffered"], r["overlap"])
        for r in rows[1:]
    ] == [
        ("b: weekly", "failed", 1.5, 1, "buffer one"),
        ("c: one-off", "missed", None, 0, "skip"),
        ("d: never ran", None, None, 0, "buffer all (limit 7)"),
        ("e: solar", None, None, 0, "replace (terminate)"),
    ]


def test_status_names_each_overlap_policy_with_its_parameter(make_task):
    """Every overlap policy in every format: the defaults of buffer all's limit (100) and of
    replace's started choice (finish) shown, and a task without a policy row as allow."""
    make_task(every=60, name="a: no policy row")
    for name, overlap, fields in (
        ("b: allow", TaskPolicy.Overlap.ALLOW, {}),
        ("c: skip", TaskPolicy.Overlap.SKIP, {}),
        ("d: buffer one", TaskPolicy.Overlap.BUFFER_ONE, {}),
        ("e: buffer all", TaskPolicy.Overlap.BUFFER_ALL, {}),
        ("f: buffer all 3", TaskPolicy.Overlap.BUFFER_ALL, {"buffer_limit": 3}),
        ("g: replace", TaskPolicy.Overlap.REPLACE, {}),
        ("h: replace terminate", TaskPolicy.Overlap.REPLACE,
         {"replace_started": TaskPolicy.ReplaceStarted.TERMINATE}),
    ):
        _policy(make_task(every=60, name=name), overlap, **fields)
    expected = [
        ("a: no policy row", "allow"), ("b: allow", "allow"), ("c: skip", "skip"),
        ("d: buffer one", "buffer one"), ("e: buffer all", "buffer all (limit 100)"),
        ("f: buffer all 3", "buffer all (limit 3)"), ("g: replace", "replace (finish)"),
        ("h: replace terminate", "replace (terminate)"),
    ]
    plain = [line.split("\t") for line in _status("--format", "plain").splitlines()]
    assert [(line[0], line[HEADER.index("Overlap")]) for line in plain[1:]] == expected
    rows = json.loads(_status("--format", "json"))
    assert [(row["name"], row["overlap"]) for row in rows] == expected
    table = _status().splitlines()
    assert [next(line for line in table if name in line).split("│")[-2].strip()
            for name, _ in expected] == [overlap for _, overlap in expected]


def test_status_table_shows_every_cell(seeded):
    text = _status()
    assert text.splitlines()[0].rstrip() == "5 periodic tasks"
    for row in [HEADER, *EXPECTED]:
        line = next(line for line in text.splitlines() if row[0] in line)
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│" if "│" in line else "┃")]
        assert tuple(cells) == row


@pytest.fixture
def upcoming_tasks(make_task):
    """A Berlin crontab whose third slot is the spring-forward of 2100-03-28, and a disabled one."""
    make_task(cron="30 2 * * *", timezone="Europe/Berlin", name="a: nightly",
              start_time=utc(2100, 3, 26, 0, 0))
    make_task(every=60, name="b: off", enabled=False)


NIGHTLY_UPCOMING = (
    "2100-03-26 01:30:00 UTC (2100-03-26 02:30:00 CET Europe/Berlin), "
    "2100-03-27 01:30:00 UTC (2100-03-27 02:30:00 CET Europe/Berlin), "
    "2100-03-28 01:00:00 UTC (2100-03-28 03:00:00 CEST Europe/Berlin; "
    "DST change: UTC offset +01:00 -> +02:00)"
)


def test_status_upcoming_plain(upcoming_tasks):
    lines = [line.split("\t") for line in _status("--format", "plain", "--upcoming", "3").splitlines()]
    assert lines[0] == [*HEADER, "Upcoming"]
    assert [(line[0], line[-1]) for line in lines[1:]] == [
        ("a: nightly", NIGHTLY_UPCOMING), ("b: off", "-"),
    ]


def test_status_upcoming_json(upcoming_tasks):
    rows = json.loads(_status("--format", "json", "--upcoming", "3"))
    assert rows[0]["upcoming"] == [
        {"slot": "2100-03-26T01:30:00+00:00", "local": "2100-03-26T02:30:00+01:00",
         "time_zone": "Europe/Berlin", "offset_change": None},
        {"slot": "2100-03-27T01:30:00+00:00", "local": "2100-03-27T02:30:00+01:00",
         "time_zone": "Europe/Berlin", "offset_change": None},
        {"slot": "2100-03-28T01:00:00+00:00", "local": "2100-03-28T03:00:00+02:00",
         "time_zone": "Europe/Berlin", "offset_change": ["+01:00", "+02:00"]},
    ]
    assert (rows[1]["name"], rows[1]["upcoming"], rows[1]["upcoming_error"]) == ("b: off", [], None)
    assert "upcoming" not in json.loads(_status("--format", "json"))[0]


def test_status_upcoming_refuses_a_negative_count(upcoming_tasks):
    with pytest.raises(CommandError, match="^--upcoming must be 0 or more, got -1$"):
        _status("--upcoming", "-1")


def test_status_piped_is_unwrapped_and_has_no_trailing_spaces(make_task):
    long_name = "a task name long enough that an eighty-column table would have to wrap it"
    make_task(every=5, name=long_name)
    text = _status("--upcoming", "2")
    lines = text.splitlines()
    assert lines[0] == "1 periodic task"
    assert [line for line in lines if line != line.rstrip()] == []
    assert len({len(line) for line in lines[1:]}) == 1  # every table line as wide as the table
    assert sum(long_name in line for line in lines) == 1  # on one line: nothing wrapped


def test_a_paused_task_shows_its_pause_and_no_upcoming_slot_until_resumed(make_task):
    """Issue 33: paused since, by, why in every format; no slot listed as upcoming while paused,
    its pending run not shown as the next run; after the resume, the slots again."""
    task = make_task(every=60, name="a: minutely")
    make_task(every=60, name="b: not paused")
    ledger.reconcile(GRACE)  # plans each task's next slot
    pause = ledger.pause(task, by="alice", why="quarter close")
    since = pause.paused_at.astimezone(UTC)
    assert Run.objects.pending().filter(periodic_task=task).exists()  # planned before the pause

    lines = [line.split("\t") for line in _status("--format", "plain", "--upcoming", "2")
             .splitlines()]
    assert lines[0] == [*HEADER, "Upcoming"]
    assert lines[1][:5] == [
        "a: minutely", "every 60 seconds", "yes",
        f"since {since:%Y-%m-%d %H:%M:%S} UTC by alice: quarter close", "-",
    ]
    assert lines[1][-1] == "none while paused"
    assert lines[2][3] == "-" and lines[2][-1].count(" UTC") == 2  # two slots listed

    rows = json.loads(_status("--format", "json", "--upcoming", "2"))
    assert rows[0]["paused"] == {"since": since.isoformat(), "by": "alice", "why": "quarter close"}
    assert (rows[0]["next_run"], rows[0]["upcoming"]) == (None, [])
    assert rows[1]["paused"] is None and len(rows[1]["upcoming"]) == 2

    table = _status("--upcoming", "2")
    line = next(line for line in table.splitlines() if "a: minutely" in line)
    assert "since" in line and "none while paused" in line

    ledger.resume(task, by="bob")
    rows = json.loads(_status("--format", "json", "--upcoming", "2"))
    assert rows[0]["paused"] is None
    assert len(rows[0]["upcoming"]) == 2
    pending = Run.objects.pending().get(periodic_task=task)
    assert rows[0]["next_run"] == pending.scheduled_for.isoformat()
