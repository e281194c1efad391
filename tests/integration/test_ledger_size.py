"""The schedule health page shows how large the run ledger is and whether it is pruned."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.template.defaultfilters import filesizeformat
from django.test import override_settings
from django.urls import reverse

from scheduling import health
from scheduling.models import Run

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]

HEALTH = reverse("admin:scheduling_schedulehealth_changelist")
OLDEST = datetime(2026, 3, 1, 4, 5, 6, 789000, tzinfo=UTC)


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def seeded(make_task) -> int:
    """Four runs, the oldest at OLDEST; return the table's bytes as PostgreSQL counts them."""
    task = make_task(every=60, name="nightly export")
    for days in (0, 1, 2, 3):
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task,
            scheduled_for=OLDEST + timedelta(days=days), status=Run.Status.SUCCEEDED,
            task_id=str(uuid.uuid4()), finished_at=OLDEST + timedelta(days=days, seconds=1),
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('scheduling_run')")
        return cursor.fetchone()[0]


def _note(html: str) -> str:
    block = html.split('id="ledger-size">', 1)[1].split("</p>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", "", block).replace("&nbsp;", " ").split())


def test_ledger_size_counts_rows_bytes_and_oldest_slot(seeded: int) -> None:
    assert seeded > 0
    assert health.ledger_size() == health.LedgerSize(runs=4, bytes=seeded, oldest=OLDEST)


def test_empty_ledger_has_no_oldest_run(db) -> None:
    size = health.ledger_size()
    assert (size.runs, size.oldest) == (0, None)


def test_health_page_shows_the_ledger_kept_forever(staff, seeded: int) -> None:
    note = _note(staff.get(HEALTH).content.decode())
    assert note == (
        f"Ledger: 4 runs, {' '.join(filesizeformat(seeded).split())} on disk; oldest run scheduled for "
        "2026-03-01 04:05:06 UTC. Every run is kept: SCHEDULING_PRUNE_OLDER_THAN is not set "
        "(scheduling_prune deletes old runs by hand)."
    )


@override_settings(SCHEDULING_PRUNE_OLDER_THAN="30d")
def test_health_page_says_what_the_replicas_prune(staff, seeded: int) -> None:
    note = _note(staff.get(HEALTH).content.decode())
    assert note.endswith(
        "The replicas delete runs that finished more than 30 days ago "
        "(SCHEDULING_PRUNE_OLDER_THAN)."
    )
