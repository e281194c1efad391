"""The schedule health page's overdue block (its own template include, admin/scheduling/overdue.html)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from scheduling import ledger
from scheduling.models import Run, TaskPolicy

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]

HEALTH = reverse("admin:scheduling_schedulehealth_changelist")


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _block(html: str) -> str:
    return html.split('id="overdue-tasks"', 1)[1].split("</div>", 1)[0]


def test_the_block_lists_overdue_tasks_with_their_runs_and_links(staff, make_task):
    assert "No task is overdue" in _block(staff.get(HEALTH).content.decode())
    task = make_task(every=60, name="sync <b>orders</b>")
    TaskPolicy.objects.create(periodic_task=task, success_deadline_seconds=30)
    slots = [ledger.database_now() - timedelta(seconds=ago) for ago in (200, 100)]
    for n, slot in enumerate(slots):
        Run.objects.create(
            periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
            task_id=f"t-{n}", status=Run.Status.DISPATCHED,
        )
    assert len(ledger.mark_overdue(None)) == 2

    block = _block(staff.get(HEALTH).content.decode())
    assert "Overdue: 1 task without a success within its deadline" in block
    items = re.findall(r'<li class="overdue-task"><a href="([^"]+)">([^<]+)</a>:\s+([^<]+)</li>', block)
    assert items == [(
        "/admin/scheduling/run/?q=sync%20%3Cb%3Eorders%3C/b%3E",
        "sync &lt;b&gt;orders&lt;/b&gt;",
        f"2 overdue runs since {slots[0]:%Y-%m-%d %H:%M:%S} UTC",
    )]
