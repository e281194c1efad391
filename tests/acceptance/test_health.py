"""``manage.py scheduling_health`` as a container probe runs it: a process of its own beside real
beat replicas, against the test database."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from scheduling import ledger
from scheduling.models import Replica, Run
from scheduling.timeformat import utc_text
from tests.acceptance.deployment import ROOT, Deployment, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

OK = "ok: 1 replica ticked within 30 s; no run pending more than 120 s past the slot\n"


def _health(deployment: Deployment, *args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "manage.py", "scheduling_health", *args],
        cwd=ROOT, env=deployment.env, capture_output=True, text=True, timeout=60, check=False,
    )
    return done.returncode, done.stdout, done.stderr


def _start_replica(deployment: Deployment, name: str) -> None:
    deployment.start_beat(name)
    deployment.wait_ready()
    wait_until(lambda: Replica.objects.filter(pk=name, stopped_at__isnull=True).exists(), 30)


def test_healthy_with_a_live_replica_then_unhealthy_when_every_replica_is_stopped(
    deployment: Deployment,
):
    _start_replica(deployment, "replica-1")
    assert _health(deployment) == (0, OK, "")

    deployment.stop("replica-1")  # SIGTERM: a clean shutdown records stopped_at
    assert Replica.objects.get(pk="replica-1").stopped_at is not None
    assert _health(deployment) == (
        1, "", "unhealthy: every beat replica is stopped (1 stopped)\n"
    )


def test_unhealthy_while_a_stuck_claim_holds_a_due_run(
    deployment: Deployment, make_task, raw_connection
):
    _start_replica(deployment, "replica-1")
    task = make_task(every=3600, name="stuck 'claim'")
    pending = wait_until(lambda: Run.objects.pending().filter(periodic_task=task).first(), 30)
    slot = ledger.database_now() + timedelta(seconds=1)
    Run.objects.filter(pk=pending.pk).update(scheduled_for=slot)
    # Another session locks the row, as a claim that never commits would: SKIP LOCKED passes it.
    raw_connection.execute("SELECT 1 FROM scheduling_run WHERE id = %s FOR UPDATE", [pending.pk])
    wait_until(lambda: ledger.database_now() > slot + timedelta(seconds=2.5), 10)

    assert _health(deployment, "--max-overdue", "2") == (
        1,
        "",
        (
            f"unhealthy: 1 run pending more than 2 s past the slot (oldest: \"stuck 'claim'\" "
            f"scheduled for {utc_text(slot)})\n"
        ),
    )
    raw_connection.rollback()  # the lock ends: the live replica dispatches the run at once
    wait_until(lambda: Run.objects.get(pk=pending.pk).status == Run.Status.DISPATCHED, 10)
    assert _health(deployment, "--max-overdue", "2") == (
        0, "ok: 1 replica ticked within 30 s; no run pending more than 2 s past the slot\n", ""
    )
