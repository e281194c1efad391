"""DST tables for ``scheduling.slots``: the ISC cron rule in four zones.

A fixed-time job (no "*" in its minute or hour field) whose local time is skipped by a spring
forward runs once at the transition instant, and runs once (first occurrence) when a fall back
repeats it; a wildcard or stepped job runs at every real instant whose local wall time matches.

Expected instants are worked out by hand from each zone's rules (2025 unless said otherwise):
- America/New_York: EST -05:00 / EDT -04:00. Spring forward 2025-03-09 02:00 EST = 07:00 UTC
  (02:00-02:59 local is skipped); fall back 2025-11-02 02:00 EDT = 06:00 UTC (01:00-01:59 local
  happens twice: 05:xx UTC as EDT, 06:xx UTC as EST).
- Europe/Berlin: CET +01:00 / CEST +02:00. Spring forward 2025-03-30 01:00 UTC (02:xx local
  skipped); fall back 2025-10-26 01:00 UTC (02:xx local twice: 00:xx UTC, then 01:xx UTC).
- Australia/Sydney: AEST +10:00 / AEDT +11:00. Fall back 2025-04-06 03:00 AEDT = 2025-04-05
  16:00 UTC (02:xx local twice: 15:xx UTC, then 16:xx UTC); spring forward 2025-10-05 02:00 AEST
  = 2025-10-04 16:00 UTC (02:xx local skipped).
- Asia/Kolkata: IST +05:30 all year, no DST.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling import slots
from tests.unit.slot_factories import BERLIN, KOLKATA, NY, SYDNEY, chain, cron_task, take, utc


def local_day_bounds(day: date, tz: str) -> tuple[datetime, datetime]:
    """Return the UTC instants of local midnight starting ``day`` and the next day."""
    zone = ZoneInfo(tz)
    start = datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone).astimezone(UTC)
    return start, end


def every(first: datetime, step: timedelta, count: int) -> list[datetime]:
    return [first + k * step for k in range(count)]


# DST: ISC cron rule ----------------------------------------------------------------------------

# Fixed-time jobs (no "*" in minute or hour): every slot over the whole local transition day.
FIXED_DAY_TABLE = [
    ("ny-spring-0230", "30 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    ("ny-spring-0200", "0 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    ("ny-spring-0215-0245", "15,45 2 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 7, 0)]),
    (
        "ny-spring-0230-0330",
        "30 2,3 * * *",
        NY,
        date(2025, 3, 9),
        [utc(2025, 3, 9, 7, 0), utc(2025, 3, 9, 7, 30)],
    ),
    ("ny-spring-1604-C05", "4 16 * * *", NY, date(2025, 3, 9), [utc(2025, 3, 9, 20, 4)]),
    ("ny-fall-0130", "30 1 * * *", NY, date(2025, 11, 2), [utc(2025, 11, 2, 5, 30)]),
    ("ny-fall-0230", "30 2 * * *", NY, date(2025, 11, 2), [utc(2025, 11, 2, 7, 30)]),
    (
        "ny-fall-0100-0200",
        "0 1,2 * * *",
        NY,
        date(2025, 11, 2),
        [utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 7, 0)],
    ),
    ("berlin-spring-0230", "30 2 * * *", BERLIN, date(2025, 3, 30), [utc(2025, 3, 30, 1, 0)]),
    ("berlin-fall-0230", "30 2 * * *", BERLIN, date(2025, 10, 26), [utc(2025, 10, 26, 0, 30)]),
    ("sydney-spring-0230", "30 2 * * *", SYDNEY, date(2025, 10, 5), [utc(2025, 10, 4, 16, 0)]),
    ("sydney-fall-0230", "30 2 * * *", SYDNEY, date(2025, 4, 6), [utc(2025, 4, 5, 15, 30)]),
    ("kolkata-0230", "30 2 * * *", KOLKATA, date(2025, 3, 9), [utc(2025, 3, 8, 21, 0)]),
    # ISC: a stepped minute makes the job a wildcard job even with a fixed hour.
    ("ny-spring-step-min-0200", "*/30 2 * * *", NY, date(2025, 3, 9), []),
    (
        "ny-fall-step-min-0100",
        "*/30 1 * * *",
        NY,
        date(2025, 11, 2),
        [
            utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 30),  # 01:00, 01:30 EDT
            utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 6, 30),  # 01:00, 01:30 EST
        ],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "day", "expected"),
    [row[1:] for row in FIXED_DAY_TABLE],
    ids=[row[0] for row in FIXED_DAY_TABLE],
)
def test_dst_fixed_time_day(expr, tz, day, expected):
    start, end = local_day_bounds(day, tz)
    task = cron_task(expr, tz)
    assert chain(task, start - timedelta(microseconds=1), end) == expected


# Wildcard / stepped hour: every slot from local 00:00 to 05:00 on the transition day.
WINDOW_TABLE = [
    (
        "ny-spring-hourly",
        "0 * * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [utc(2025, 3, 9, 5), utc(2025, 3, 9, 6), utc(2025, 3, 9, 7), utc(2025, 3, 9, 8)],
    ),
    (
        "ny-fall-hourly",
        "0 * * * *",
        NY,
        (utc(2025, 11, 2, 4), utc(2025, 11, 2, 10)),
        [
            utc(2025, 11, 2, 4),  # 00:00 EDT
            utc(2025, 11, 2, 5),  # 01:00 EDT
            utc(2025, 11, 2, 6),  # 01:00 EST
            utc(2025, 11, 2, 7),
            utc(2025, 11, 2, 8),
            utc(2025, 11, 2, 9),
        ],
    ),
    (
        "ny-spring-every-30-min",
        "*/30 * * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [
            utc(2025, 3, 9, 5, 0), utc(2025, 3, 9, 5, 30),  # 00:00, 00:30 EST
            utc(2025, 3, 9, 6, 0), utc(2025, 3, 9, 6, 30),  # 01:00, 01:30 EST
            utc(2025, 3, 9, 7, 0), utc(2025, 3, 9, 7, 30),  # 03:00, 03:30 EDT
            utc(2025, 3, 9, 8, 0), utc(2025, 3, 9, 8, 30),
        ],
    ),
    (
        "ny-fall-every-30-min",
        "*/30 * * * *",
        NY,
        (utc(2025, 11, 2, 4), utc(2025, 11, 2, 10)),
        [
            utc(2025, 11, 2, 4, 0), utc(2025, 11, 2, 4, 30),
            utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 30),  # 01:00, 01:30 EDT
            utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 6, 30),  # 01:00, 01:30 EST
            utc(2025, 11, 2, 7, 0), utc(2025, 11, 2, 7, 30),
            utc(2025, 11, 2, 8, 0), utc(2025, 11, 2, 8, 30),
            utc(2025, 11, 2, 9, 0), utc(2025, 11, 2, 9, 30),
        ],
    ),
    (
        "ny-spring-every-2-hours",
        "0 */2 * * *",
        NY,
        (utc(2025, 3, 9, 5), utc(2025, 3, 9, 9)),
        [utc(2025, 3, 9, 5), utc(2025, 3, 9, 8)],  # 00:00 EST, (02:00 skipped), 04:00 EDT
    ),
    (
        "berlin-spring-hourly",
        "0 * * * *",
        BERLIN,
        (utc(2025, 3, 29, 23), utc(2025, 3, 30, 3)),
        [utc(2025, 3, 29, 23), utc(2025, 3, 30, 0), utc(2025, 3, 30, 1), utc(2025, 3, 30, 2)],
    ),
    (
        "berlin-fall-hourly",
        "0 * * * *",
        BERLIN,
        (utc(2025, 10, 25, 22), utc(2025, 10, 26, 4)),
        [
            utc(2025, 10, 25, 22),
            utc(2025, 10, 25, 23),
            utc(2025, 10, 26, 0),  # 02:00 CEST
            utc(2025, 10, 26, 1),  # 02:00 CET
            utc(2025, 10, 26, 2),
            utc(2025, 10, 26, 3),
        ],
    ),
    (
        "berlin-spring-every-30-min",
        "*/30 * * * *",
        BERLIN,
        (utc(2025, 3, 29, 23), utc(2025, 3, 30, 3)),
        [
            utc(2025, 3, 29, 23, 0), utc(2025, 3, 29, 23, 30),
            utc(2025, 3, 30, 0, 0), utc(2025, 3, 30, 0, 30),
            utc(2025, 3, 30, 1, 0), utc(2025, 3, 30, 1, 30),  # 03:00, 03:30 CEST
            utc(2025, 3, 30, 2, 0), utc(2025, 3, 30, 2, 30),
        ],
    ),
    (
        "berlin-fall-every-30-min",
        "*/30 * * * *",
        BERLIN,
        (utc(2025, 10, 25, 22), utc(2025, 10, 26, 4)),
        [
            utc(2025, 10, 25, 22, 0), utc(2025, 10, 25, 22, 30),
            utc(2025, 10, 25, 23, 0), utc(2025, 10, 25, 23, 30),
            utc(2025, 10, 26, 0, 0), utc(2025, 10, 26, 0, 30),  # 02:00, 02:30 CEST
            utc(2025, 10, 26, 1, 0), utc(2025, 10, 26, 1, 30),  # 02:00, 02:30 CET
            utc(2025, 10, 26, 2, 0), utc(2025, 10, 26, 2, 30),
            utc(2025, 10, 26, 3, 0), utc(2025, 10, 26, 3, 30),
        ],
    ),
    (
        "sydney-fall-hourly",
        "0 * * * *",
        SYDNEY,
        (utc(2025, 4, 5, 13), utc(2025, 4, 5, 19)),
        [
            utc(2025, 4, 5, 13),
            utc(2025, 4, 5, 14),
            utc(2025, 4, 5, 15),  # 02:00 AEDT
            utc(2025, 4, 5, 16),  # 02:00 AEST
            utc(2025, 4, 5, 17),
            utc(2025, 4, 5, 18),
        ],
    ),
    (
        "sydney-spring-hourly",
        "0 * * * *",
        SYDNEY,
        (utc(2025, 10, 4, 14), utc(2025, 10, 4, 18)),
        [utc(2025, 10, 4, 14), utc(2025, 10, 4, 15), utc(2025, 10, 4, 16), utc(2025, 10, 4, 17)],
    ),
    (
        "sydney-fall-every-30-min",
        "*/30 * * * *",
        SYDNEY,
        (utc(2025, 4, 5, 13), utc(2025, 4, 5, 19)),
        [
            utc(2025, 4, 5, 13, 0), utc(2025, 4, 5, 13, 30),
            utc(2025, 4, 5, 14, 0), utc(2025, 4, 5, 14, 30),
            utc(2025, 4, 5, 15, 0), utc(2025, 4, 5, 15, 30),  # 02:00, 02:30 AEDT
            utc(2025, 4, 5, 16, 0), utc(2025, 4, 5, 16, 30),  # 02:00, 02:30 AEST
            utc(2025, 4, 5, 17, 0), utc(2025, 4, 5, 17, 30),
            utc(2025, 4, 5, 18, 0), utc(2025, 4, 5, 18, 30),
        ],
    ),
    (
        "sydney-spring-every-30-min",
        "*/30 * * * *",
        SYDNEY,
        (utc(2025, 10, 4, 14), utc(2025, 10, 4, 18)),
        [
            utc(2025, 10, 4, 14, 0), utc(2025, 10, 4, 14, 30),
            utc(2025, 10, 4, 15, 0), utc(2025, 10, 4, 15, 30),
            utc(2025, 10, 4, 16, 0), utc(2025, 10, 4, 16, 30),  # 03:00, 03:30 AEDT
            utc(2025, 10, 4, 17, 0), utc(2025, 10, 4, 17, 30),
        ],
    ),
    (
        "kolkata-hourly",
        "0 * * * *",
        KOLKATA,
        (utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 23, 30)),
        [
            utc(2025, 3, 8, 18, 30),
            utc(2025, 3, 8, 19, 30),
            utc(2025, 3, 8, 20, 30),
            utc(2025, 3, 8, 21, 30),
            utc(2025, 3, 8, 22, 30),
        ],
    ),
    (
        "kolkata-every-30-min",
        "*/30 * * * *",
        KOLKATA,
        (utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 23, 30)),
        [
            utc(2025, 3, 8, 18, 30), utc(2025, 3, 8, 19, 0),
            utc(2025, 3, 8, 19, 30), utc(2025, 3, 8, 20, 0),
            utc(2025, 3, 8, 20, 30), utc(2025, 3, 8, 21, 0),
            utc(2025, 3, 8, 21, 30), utc(2025, 3, 8, 22, 0),
            utc(2025, 3, 8, 22, 30), utc(2025, 3, 8, 23, 0),
        ],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "window", "expected"),
    [row[1:] for row in WINDOW_TABLE],
    ids=[row[0] for row in WINDOW_TABLE],
)
def test_dst_wildcard_window(expr, tz, window, expected):
    start, end = window
    assert chain(cron_task(expr, tz), start - timedelta(microseconds=1), end) == expected


# Wildcard jobs over the whole local transition day. All these zones move by whole hours, so
# the slots are evenly spaced in UTC: (first slot, spacing, number of slots).
WHOLE_DAY_TABLE = [
    ("ny-spring-hourly", "0 * * * *", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 23),
    ("ny-fall-hourly", "0 * * * *", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 60, 25),
    ("ny-spring-30-min", "*/30 * * * *", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 30, 46),
    ("ny-fall-30-min", "*/30 * * * *", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 30, 50),
    ("ny-spring-sunday-hourly", "0 * * * 0", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 23),
    ("ny-fall-sunday-hourly", "0 * * * 0", NY, date(2025, 11, 2), utc(2025, 11, 2, 4), 60, 25),
    ("ny-spring-monday-hourly", "0 * * * 1", NY, date(2025, 3, 9), utc(2025, 3, 9, 5), 60, 0),
    ("berlin-spring-hourly", "0 * * * *", BERLIN, date(2025, 3, 30), utc(2025, 3, 29, 23), 60, 23),
    ("berlin-fall-hourly", "0 * * * *", BERLIN, date(2025, 10, 26), utc(2025, 10, 25, 22), 60, 25),
    ("berlin-fall-30m", "*/30 * * * *", BERLIN, date(2025, 10, 26), utc(2025, 10, 25, 22), 30, 50),
    ("sydney-fall-hourly", "0 * * * *", SYDNEY, date(2025, 4, 6), utc(2025, 4, 5, 13), 60, 25),
    ("sydney-spring-hourly", "0 * * * *", SYDNEY, date(2025, 10, 5), utc(2025, 10, 4, 14), 60, 23),
    ("sydney-spring-30m", "*/30 * * * *", SYDNEY, date(2025, 10, 5), utc(2025, 10, 4, 14), 30, 46),
    ("kolkata-hourly", "0 * * * *", KOLKATA, date(2025, 3, 9), utc(2025, 3, 8, 18, 30), 60, 24),
]


@pytest.mark.parametrize(
    ("expr", "tz", "day", "first", "minutes", "count"),
    [row[1:] for row in WHOLE_DAY_TABLE],
    ids=[row[0] for row in WHOLE_DAY_TABLE],
)
def test_dst_wildcard_whole_day(expr, tz, day, first, minutes, count):
    start, end = local_day_bounds(day, tz)
    found = chain(cron_task(expr, tz), start - timedelta(microseconds=1), end)
    assert found == every(first, timedelta(minutes=minutes), count)


# Day-of-week job across three Sundays around each transition (all transitions are Sundays).
WEEKLY_TABLE = [
    (
        "ny-spring",
        "30 2 * * 0",
        NY,
        utc(2025, 3, 1),
        [utc(2025, 3, 2, 7, 30), utc(2025, 3, 9, 7, 0), utc(2025, 3, 16, 6, 30)],
    ),
    (
        "ny-fall",
        "30 1 * * 0",
        NY,
        utc(2025, 10, 25),
        [utc(2025, 10, 26, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 9, 6, 30)],
    ),
    (
        "berlin-spring",
        "30 2 * * 0",
        BERLIN,
        utc(2025, 3, 22),
        [utc(2025, 3, 23, 1, 30), utc(2025, 3, 30, 1, 0), utc(2025, 4, 6, 0, 30)],
    ),
    (
        "berlin-fall",
        "30 2 * * 0",
        BERLIN,
        utc(2025, 10, 18),
        [utc(2025, 10, 19, 0, 30), utc(2025, 10, 26, 0, 30), utc(2025, 11, 2, 1, 30)],
    ),
    (
        "sydney-fall",
        "30 2 * * 0",
        SYDNEY,
        utc(2025, 3, 28),
        [utc(2025, 3, 29, 15, 30), utc(2025, 4, 5, 15, 30), utc(2025, 4, 12, 16, 30)],
    ),
    (
        "sydney-spring",
        "30 2 * * 0",
        SYDNEY,
        utc(2025, 9, 26),
        [utc(2025, 9, 27, 16, 30), utc(2025, 10, 4, 16, 0), utc(2025, 10, 11, 15, 30)],
    ),
    (
        "kolkata",
        "30 2 * * 0",
        KOLKATA,
        utc(2025, 2, 28),
        [utc(2025, 3, 1, 21, 0), utc(2025, 3, 8, 21, 0), utc(2025, 3, 15, 21, 0)],
    ),
]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [row[1:] for row in WEEKLY_TABLE],
    ids=[row[0] for row in WEEKLY_TABLE],
)
def test_dst_day_of_week(expr, tz, after, expected):
    assert take(cron_task(expr, tz), after, 3) == expected


# next_run from an instant inside the skipped or repeated hour.
MID_TRANSITION_TABLE = [
    ("ny-fixed-before-gap", "30 2 * * *", NY, utc(2025, 3, 9, 6, 59, 59), utc(2025, 3, 9, 7, 0)),
    ("ny-fixed-at-gap", "30 2 * * *", NY, utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30)),
    ("ny-fixed-first-pass", "15 1 * * *", NY, utc(2025, 11, 2, 5, 0), utc(2025, 11, 2, 5, 15)),
    ("ny-fixed-1st-pass-gone", "45 1 * * *", NY, utc(2025, 11, 2, 5, 50), utc(2025, 11, 3, 6, 45)),
    ("ny-fixed-second-pass", "30 1 * * *", NY, utc(2025, 11, 2, 6, 0), utc(2025, 11, 3, 6, 30)),
    ("ny-hourly-first-pass", "0 * * * *", NY, utc(2025, 11, 2, 5, 30), utc(2025, 11, 2, 6, 0)),
    ("ny-hourly-second-pass", "0 * * * *", NY, utc(2025, 11, 2, 6, 0), utc(2025, 11, 2, 7, 0)),
    ("ny-45-first-pass", "45 * * * *", NY, utc(2025, 11, 2, 5, 50), utc(2025, 11, 2, 6, 45)),
    ("syd-fixed-2nd-pass", "30 2 * * *", SYDNEY, utc(2025, 4, 5, 16, 0), utc(2025, 4, 6, 16, 30)),
    ("syd-fixed-before-gap", "30 2 * * *", SYDNEY, utc(2025, 10, 4, 15, 59), utc(2025, 10, 4, 16)),
]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [row[1:] for row in MID_TRANSITION_TABLE],
    ids=[row[0] for row in MID_TRANSITION_TABLE],
)
def test_dst_next_run_inside_transition(expr, tz, after, expected):
    assert slots.next_run(cron_task(expr, tz), after) == expected
