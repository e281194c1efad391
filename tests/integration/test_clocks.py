"""What a process's clock can no longer decide: the anchor of a saved task, a message's expiry.

Migration 0017 keeps ``date_changed`` (django-celery-beat's ``auto_now``, written from the saving
process's clock) at or before the database clock; the claim counts ``expire_seconds`` from the
database clock. The skewed writer is a real process under libfaketime (``tests.faketime``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling import ledger, slots
from tests import faketime
from tests.acceptance import deployment
from tests.integration.conftest import GRACE, claim, make_due

pytestmark = pytest.mark.django_db(transaction=True)

_SAVE = """
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from django.utils import timezone
every, _ = IntervalSchedule.objects.get_or_create(every=10, period="seconds")
task = PeriodicTask.objects.create(name="saved ahead", task="project.tasks.record", interval=every)
print(timezone.now().isoformat())
"""


def test_a_task_saved_by_a_process_an_hour_ahead_is_anchored_on_the_database_clock():
    library = faketime.require()
    before = ledger.database_now()
    saved = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", _SAVE],
        cwd=deployment.ROOT, capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, **faketime.environment("+1h", library),
             "DATABASE_URL": deployment.test_database_url()},
    )
    after = ledger.database_now()

    process_now = datetime.fromisoformat(saved.stdout.strip().splitlines()[-1])
    assert before + timedelta(minutes=59) < process_now < after + timedelta(minutes=61)
    task = PeriodicTask.objects.get(name="saved ahead")
    assert before <= task.date_changed <= after
    # Its first slot is one interval after the save by the database clock, not an hour later.
    first = slots.initial_run(task, after, last_slot=None, grace=GRACE)
    assert first == task.date_changed + timedelta(seconds=10)


def test_a_date_changed_ahead_of_the_database_is_brought_back_and_an_earlier_one_kept(make_task):
    task = make_task(every=10)
    now = ledger.database_now()
    PeriodicTask.objects.filter(pk=task.pk).update(date_changed=now + timedelta(hours=1))
    stored = PeriodicTask.objects.get(pk=task.pk).date_changed
    assert now <= stored <= ledger.database_now()

    PeriodicTask.objects.filter(pk=task.pk).update(date_changed=now - timedelta(days=2))
    assert PeriodicTask.objects.get(pk=task.pk).date_changed == now - timedelta(days=2)


def test_the_claim_sends_expire_seconds_as_an_instant_on_the_database_clock(make_task, recorder):
    task = make_task(every=3600, expire_seconds=5400)
    make_due(task)
    before = ledger.database_now()
    [dispatched] = claim(recorder)
    after = ledger.database_now()

    [message] = recorder.messages
    expires = message.options["expires"]
    assert before + timedelta(seconds=5400) <= expires <= after + timedelta(seconds=5400)
    assert dispatched.task_id == message.options["task_id"]
