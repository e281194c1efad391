"""Issue 3 acceptance 5: ten replicas started at the same instant with five beat_schedule entries.

Each replica syncs CELERY_BEAT_SCHEDULE into periodic tasks when it starts. Exactly five periodic
tasks must exist, with one schedule row per distinct schedule, none updated after it was created,
and django-celery-beat's change marker must not move after start-up (no reload storm).
"""

from __future__ import annotations

import time

import pytest
from django_celery_beat.models import (
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    PeriodicTasks,
)

from scheduling.models import ScheduleChange
from tests.acceptance.deployment import Deployment
from tests.acceptance.settings_beat_schedule import CELERY_BEAT_SCHEDULE

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.once,
    pytest.mark.django_db(transaction=True),
]

REPLICAS = [f"replica-{i}" for i in range(1, 11)]


def test_ten_replicas_starting_at_once_create_five_tasks_and_no_reload(deployment: Deployment):
    for name in REPLICAS:  # all started before any is waited for
        deployment.start_beat(
            name, DJANGO_SETTINGS_MODULE="tests.acceptance.settings_beat_schedule"
        )
    for name in REPLICAS:
        deployment.wait_for_log(name, "beat: Starting...", timeout=90)
    time.sleep(3)  # every replica has ticked (and reconciled) at least once
    marker = PeriodicTasks.last_change()
    time.sleep(5)

    assert PeriodicTasks.last_change() == marker
    assert sorted(PeriodicTask.objects.values_list("name", flat=True)) == sorted(
        CELERY_BEAT_SCHEDULE
    )
    # no task was written after its creation (the triggers log every definition change), and
    # each creation was logged once, for the reconcile passes to plan
    assert sorted(ScheduleChange.objects.values_list("kind", "object_id")) == sorted(
        (ScheduleChange.Kind.UNPLANNED, pk)
        for pk in PeriodicTask.objects.values_list("pk", flat=True)
    )
    assert sorted(IntervalSchedule.objects.values_list("every", "period")) == [
        (30, "seconds"), (45, "seconds")
    ]
    assert sorted(CrontabSchedule.objects.values_list("minute", "hour")) == [("0", "3"), ("7", "*")]
    shared = PeriodicTask.objects.filter(name__in=["beat: every 30 s", "beat: also every 30 s"])
    assert len({t.interval_id for t in shared}) == 1
    assert max(t.date_changed for t in PeriodicTask.objects.all()) <= marker
    for name in REPLICAS:
        assert "cannot sync beat_schedule entry" not in deployment.log_path(name).read_text()
