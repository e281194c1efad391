"""System checks (USE_TZ, SKIP LOCKED) and settings time zones that must not move crontab runs."""

from __future__ import annotations

from datetime import UTC, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.checks import run_checks
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from project.celery import app
from scheduling import ledger
from scheduling.models import Run
from tests.integration.conftest import GRACE


def _e002() -> list:
    return [e for e in run_checks() if e.id == "scheduling.E002"]


@pytest.mark.django_db
def test_postgresql_with_skip_locked_passes_the_check():
    assert _e002() == []


@pytest.mark.django_db
def test_a_database_without_skip_locked_is_a_system_check_error(monkeypatch):
    connection = connections["default"]
    monkeypatch.setattr(connection.features, "has_select_for_update_skip_locked", False)
    errors = _e002()
    assert [(e.msg, e.hint) for e in errors] == [
        (
            "scheduling needs PostgreSQL (SELECT ... FOR UPDATE SKIP LOCKED); the default "
            "database is postgresql.",
            "Point DATABASE_URL (or DATABASES['default']) at PostgreSQL 14 or newer.",
        )
    ]


@pytest.mark.django_db
def test_another_database_vendor_is_a_system_check_error(monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    assert [e.msg for e in _e002()] == [
        "scheduling needs PostgreSQL (SELECT ... FOR UPDATE SKIP LOCKED); the default "
        "database is sqlite."
    ]


@pytest.mark.django_db
def test_another_database_vendor_is_reported_once_not_again_as_the_direct_database(monkeypatch):
    """On SQLite, E002 says why; E004 about SCHEDULING_DIRECT_DATABASE, never set, is not added."""
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    found = [e.id for e in run_checks() if e.id.startswith("scheduling.E")]
    assert found == ["scheduling.E002"]


ZONES = [
    ("UTC", "UTC"),
    ("Asia/Tokyo", "Pacific/Auckland"),
    ("America/Los_Angeles", "Asia/Kolkata"),
]


@pytest.mark.django_db(transaction=True)
def test_time_zone_and_celery_timezone_never_shift_crontab_runs(make_task):
    """A crontab is evaluated in its own timezone, whatever TIME_ZONE and CELERY_TIMEZONE say."""
    new_york = make_task(cron="0 9 * * *", timezone="America/New_York")
    utc_task = make_task(cron="30 14 * * *", timezone="UTC")
    planned = []
    for time_zone, celery_timezone in ZONES:
        Run.objects.all().delete()
        with override_settings(TIME_ZONE=time_zone, CELERY_TIMEZONE=celery_timezone):
            app.conf.timezone = celery_timezone
            try:
                timezone.activate(time_zone)
                ledger.reconcile(GRACE)
            finally:
                timezone.deactivate()
                app.conf.timezone = None
        planned.append(dict(Run.objects.pending().values_list("periodic_task_id", "scheduled_for")))
    assert planned[0] == planned[1] == planned[2]
    assert planned[0] == {
        new_york.pk: _next_local(new_york.date_changed, "America/New_York", 9, 0),
        utc_task.pk: _next_local(utc_task.date_changed, "UTC", 14, 30),
    }


def _next_local(after, zone: str, hour: int, minute: int):
    """The first local hour:minute in ``zone`` after ``after``, in UTC (no DST date nearby)."""
    tz = ZoneInfo(zone)
    local = after.astimezone(tz)
    candidate = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if candidate <= local:
        candidate = (local + timedelta(days=1)).replace(
            hour=hour, minute=minute, second=0, microsecond=0
        )
    return candidate.astimezone(UTC)
