"""Property tests of ``scheduling.slots`` (hypothesis), against brute force and croniter.

croniter is used with ``day_or=False`` because this engine, like Celery, requires day of month
AND day of week to match. Its DST handling differs from the ISC rule, so it is only compared in
zones without DST or away from transitions; near transitions the oracle is a brute-force walk
over every UTC minute.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from celery import schedules
from croniter import croniter
from django_celery_beat.models import IntervalSchedule
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from scheduling import slots
from tests.unit.slot_factories import (
    BERLIN,
    KOLKATA,
    NY,
    SYDNEY,
    chain,
    cron_task,
    interval_task,
    take,
    utc,
)

DST_ZONES = [
    NY,
    BERLIN,
    SYDNEY,
    "Australia/Lord_Howe",  # 30-minute DST shift
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Sao_Paulo",  # midnight transitions until 2019
    "America/Havana",  # midnight transitions
    "America/St_Johns",  # -03:30 / -02:30
    "Europe/Dublin",
    "Africa/Casablanca",  # Ramadan shifts
]
ALL_ZONES = ["UTC", KOLKATA, *DST_ZONES]
YEARS = (2012, 2032)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def transitions(tz: str) -> tuple[datetime, ...]:
    """Return the UTC instants (to the minute) at which ``tz`` changes its offset in YEARS."""
    zone = ZoneInfo(tz)
    found: list[datetime] = []
    day = utc(YEARS[0], 1, 1)
    end = utc(YEARS[1] + 1, 1, 1)
    while day < end:
        nxt = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = day, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid <= lo:
                    mid = lo + timedelta(minutes=1)
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        day = nxt
    return tuple(found)


def near_transition(tz: str, start: datetime, end: datetime, margin: timedelta) -> bool:
    return any(start - margin <= t <= end + margin for t in transitions(tz))


def field(lo: int, hi: int) -> st.SearchStrategy[str]:
    """Cron field text both Celery and croniter read the same way (no ``a-a`` ranges)."""
    n = st.integers(lo, hi)
    pair = st.lists(n, min_size=2, max_size=2, unique=True).map(sorted)
    return st.one_of(
        st.just("*"),
        st.integers(2, max(2, (hi - lo + 1) // 2)).map(lambda s: f"*/{s}"),
        n.map(str),
        pair.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.tuples(pair, st.integers(2, 10)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}"),
        st.lists(n, min_size=2, max_size=4, unique=True).map(
            lambda xs: ",".join(map(str, sorted(xs)))
        ),
    )


def mostly_star(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.just("*"), strategy)


# Day of month 1-28 so that every expression matches some day within a few years.
CRON_EXPR = st.tuples(
    field(0, 59),
    field(0, 23),
    mostly_star(field(1, 28)),
    mostly_star(field(1, 12)),
    mostly_star(field(0, 6)),
).map(" ".join)
# Sparser minutes for tests that chain across whole days.
SPARSE_MINUTE = st.one_of(
    st.integers(0, 59).map(str),
    st.lists(st.integers(0, 59), min_size=2, max_size=3, unique=True).map(
        lambda xs: ",".join(map(str, sorted(xs)))
    ),
    st.integers(10, 30).map(lambda s: f"*/{s}"),
    st.tuples(st.integers(0, 50), st.integers(1, 9)).map(lambda p: f"{p[0]}-{p[0] + p[1]}"),
)
DENSE_DAY_EXPR = st.tuples(
    SPARSE_MINUTE, field(0, 23), mostly_star(field(1, 28)), st.just("*"), mostly_star(field(0, 6))
).map(" ".join)

INSTANT = st.datetimes(
    min_value=datetime(YEARS[0], 1, 2), max_value=datetime(YEARS[1], 12, 1), timezones=st.just(UTC)
)


@st.composite
def zone_and_instant(draw, zones=tuple(ALL_ZONES)):
    """A zone and an instant, half of the time within 36 hours of one of its transitions."""
    tz = draw(st.sampled_from(zones))
    moments = transitions(tz)
    if moments and draw(st.booleans()):
        center = draw(st.sampled_from(moments))
        offset = draw(st.integers(-36 * 3600, 36 * 3600))
        return tz, center + timedelta(seconds=offset, microseconds=draw(st.integers(0, 999_999)))
    return tz, draw(INSTANT)


@st.composite
def job_across_transition(draw):
    """A DST zone, an instant 1 minute to 29 hours before one of its transitions, and a job.

    Half of the jobs have an hour field naming the local hour that the transition skips or
    repeats, so fixed-time jobs meet the ISC rule often.
    """
    tz = draw(st.sampled_from(DST_ZONES))
    moment = draw(st.sampled_from(transitions(tz)))
    before = timedelta(
        seconds=draw(st.integers(60, 29 * 3600)), microseconds=draw(st.integers(0, 999_999))
    )
    zone = ZoneInfo(tz)
    old = (moment - timedelta(minutes=1)).astimezone(zone).utcoffset()
    new = moment.astimezone(zone).utcoffset()
    touched = sorted(
        {
            (moment + old).hour,
            (moment + new).hour,
            (moment + max(old, new) - timedelta(minutes=1)).hour,
        }
    )
    hour = draw(
        st.one_of(
            field(0, 23),
            st.sampled_from(touched).map(str),
            st.just(",".join(map(str, touched))),
        )
    )
    minute = draw(SPARSE_MINUTE)
    days = draw(st.tuples(mostly_star(field(1, 28)), st.just("*"), mostly_star(field(0, 6))))
    return tz, moment - before, " ".join((minute, hour, *days))


def parsed(expr: str) -> schedules.crontab:
    minute, hour, dom, month, dow = expr.split()
    return schedules.crontab(
        minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow
    )


def wall_matches(cron: schedules.crontab, wall: datetime) -> bool:
    return (
        wall.minute in cron.minute
        and wall.hour in cron.hour
        and wall.day in cron.day_of_month
        and wall.month in cron.month_of_year
        and wall.isoweekday() % 7 in cron.day_of_week
    )


def is_fixed(expr: str) -> bool:
    minute, hour = expr.split()[:2]
    return "*" not in minute and "*" not in hour


def brute_force(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    """Return the ISC-rule slots in ``(after, until]`` by testing every UTC minute.

    A wildcard job fires at every minute whose local wall time matches. A fixed-time job fires
    at the first occurrence (fold 0) of a matching wall time, and at a spring-forward instant
    when a matching wall time lies in the skipped gap.
    """
    zone = ZoneInfo(tz)
    cron = parsed(expr)
    fixed = is_fixed(expr)
    found: list[datetime] = []
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    previous_offset = (t - timedelta(minutes=1)).astimezone(zone).utcoffset()
    while t <= until:
        local = t.astimezone(zone)
        offset = local.utcoffset()
        hit = wall_matches(cron, local.replace(tzinfo=None)) and (not fixed or local.fold == 0)
        if fixed and not hit and offset > previous_offset:
            wall = (t + previous_offset).replace(tzinfo=None)
            while wall < (t + offset).replace(tzinfo=None) and not hit:
                hit = wall_matches(cron, wall)
                wall += timedelta(minutes=1)
        if hit:
            found.append(t)
        previous_offset = offset
        t += timedelta(minutes=1)
    return found


@PROPS
@given(job_across_transition())
def test_property_crontab_agrees_with_brute_force_isc_rule(case):
    tz, after, expr = case
    until = after + timedelta(hours=30)
    expected = brute_force(expr, tz, after, until)
    crossed = [t for t in transitions(tz) if after < t <= until]
    near = any(abs(s - t) <= timedelta(hours=1) for s in expected for t in crossed)
    kind = "fixed" if is_fixed(expr) else "wildcard"
    event(f"{kind} job, slot within 1 h of the transition: {near}")
    assert chain(cron_task(expr, tz), after, until + timedelta(microseconds=1)) == expected


@PROPS
@given(zone_and_instant(), CRON_EXPR, st.data())
def test_property_crontab_slots_increase_and_next_run_is_the_least(zone_instant, expr, data):
    tz, after = zone_instant
    task = cron_task(expr, tz)
    found = take(task, after, 12)
    assert len(found) == 12
    assert all(s.tzinfo is UTC for s in found)
    assert after < found[0]
    assert all(a < b for a, b in itertools.pairwise(found))
    # From any instant between two slots, next_run is the later one.
    i = data.draw(st.integers(0, len(found) - 2))
    gap = (found[i + 1] - found[i]) // timedelta(microseconds=1)
    probe = found[i] + timedelta(microseconds=data.draw(st.integers(0, gap - 1)))
    assert slots.next_run(task, probe) == found[i + 1]


@PROPS
@given(zone_and_instant(), CRON_EXPR)
def test_property_crontab_slots_match_expression_in_local_time(zone_instant, expr):
    tz, after = zone_instant
    zone = ZoneInfo(tz)
    cron = parsed(expr)
    for slot in take(cron_task(expr, tz), after, 12):
        local = slot.astimezone(zone)
        if wall_matches(cron, local.replace(tzinfo=None)):
            assert local.second == 0 and local.microsecond == 0
            continue
        # Only a fixed-time job moved to a spring-forward instant may not match its wall time.
        before = (slot - timedelta(seconds=1)).astimezone(zone).utcoffset()
        assert is_fixed(expr), (slot, local)
        assert local.utcoffset() > before, (slot, local)
        gap_start = (slot + before).replace(tzinfo=None)
        gap = [
            gap_start + timedelta(minutes=m)
            for m in range((local.utcoffset() - before) // timedelta(minutes=1))
        ]
        assert any(wall_matches(cron, wall) for wall in gap), (slot, local)


@PROPS
@given(zone_and_instant(zones=tuple(DST_ZONES)), st.integers(0, 59), st.integers(0, 23))
def test_property_fixed_local_time_runs_once_per_local_date(zone_instant, minute, hour):
    tz, after = zone_instant
    zone = ZoneInfo(tz)
    after -= timedelta(days=2)
    found = take(cron_task(f"{minute} {hour} * * *", tz), after, 5)
    dates = [s.astimezone(zone).date() for s in found]
    assert len(set(dates)) == len(dates) == 5
    # One slot per calendar day: five consecutive local dates.
    assert [(d - dates[0]).days for d in dates] == [0, 1, 2, 3, 4]


INTERVAL_PERIOD = st.sampled_from(
    [
        IntervalSchedule.SECONDS,
        IntervalSchedule.MINUTES,
        IntervalSchedule.HOURS,
        IntervalSchedule.DAYS,
    ]
)


@PROPS
@given(
    st.integers(1, 1000),
    INTERVAL_PERIOD,
    INSTANT,
    st.one_of(st.none(), INSTANT),
    st.integers(-(10**9), 10**9),
)
def test_property_interval_slots_are_exactly_every_apart(n, period, changed, start_time, shift):
    task = interval_task(n, period, date_changed=changed, start_time=start_time)
    step = timedelta(**{period: n})
    anchor = start_time if start_time is not None else changed + step
    after = anchor + timedelta(seconds=shift)
    found = take(task, after, 10)
    assert found[0] > after
    assert found[0] == anchor or found[0] - step <= after
    assert (found[0] - anchor) % step == timedelta(0)
    assert [b - a for a, b in itertools.pairwise(found)] == [step] * 9


@PROPS
@given(
    st.integers(1, 120),
    INSTANT,
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.one_of(st.none(), st.integers(0, 5000)),
)
def test_property_interval_slots_through_agrees_with_chaining(n, anchor, k, until_s, expires_s):
    expires = None if expires_s is None else anchor + timedelta(seconds=expires_s)
    task = interval_task(n, start_time=anchor, expires=expires)
    slot = anchor + k * timedelta(seconds=n)
    assume(expires is None or slot < expires)
    until = slot + timedelta(seconds=until_s)
    counted = chain(task, slot, until + timedelta(microseconds=1))
    assert slots.slots_through(task, slot, until) == (len(counted), slots.next_run(task, until))


@PROPS
@given(
    zone_and_instant(),
    DENSE_DAY_EXPR,
    st.integers(0, 48 * 3600),
    st.one_of(st.none(), st.integers(0, 48 * 3600)),
)
def test_property_crontab_slots_through_agrees_with_chaining(
    zone_instant, expr, until_s, expires_s
):
    tz, after = zone_instant
    expires = None if expires_s is None else after + timedelta(seconds=expires_s)
    task = cron_task(expr, tz, expires=expires)
    slot = slots.next_run(task, after)
    assume(slot is not None)
    until = slot + timedelta(seconds=until_s)
    counted = chain(task, slot, until + timedelta(microseconds=1))
    assert slots.slots_through(task, slot, until) == (len(counted), slots.next_run(task, until))


def croniter_slots(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    it = croniter(expr, after.astimezone(ZoneInfo(tz)), day_or=False)
    return [it.get_next(datetime).astimezone(UTC) for _ in range(n)]


@PROPS
@given(
    st.sampled_from(["UTC", KOLKATA]), INSTANT.map(lambda d: d.replace(microsecond=0)), CRON_EXPR
)
def test_property_crontab_agrees_with_croniter_without_dst(tz, after, expr):
    assert take(cron_task(expr, tz), after, 8) == croniter_slots(expr, tz, after, 8)


@PROPS
@given(
    st.sampled_from([NY, BERLIN, SYDNEY]),
    INSTANT.map(lambda d: d.replace(microsecond=0)),
    CRON_EXPR,
)
def test_property_crontab_agrees_with_croniter_away_from_transitions(tz, after, expr):
    task = cron_task(expr, tz)
    ours = take(task, after, 6)
    theirs = croniter_slots(expr, tz, after, 6)
    previous = after
    for mine, other in zip(ours, theirs, strict=True):
        if near_transition(tz, previous, mine, timedelta(days=2)):
            break
        assert mine == other
        previous = mine
