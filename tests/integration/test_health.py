"""``manage.py scheduling_health``: one line, exit 0 or 1, for each state of the deployment."""

from __future__ import annotations

import io
import socket
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from scheduling import ledger
from scheduling.models import Replica, Run
from scheduling.replicas import Heartbeat
from tests.integration.conftest import claim

pytestmark = pytest.mark.django_db(transaction=True)


def _health(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("scheduling_health", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def _replica(name: str, ago: float, host: str = "h1", stopped: bool = False) -> None:
    now = ledger.database_now()
    Replica.objects.create(
        id=name, host=host, pid=1, started_at=now - timedelta(hours=1),
        last_tick_at=now - timedelta(seconds=ago), stopped_at=now if stopped else None,
    )


def test_healthy_with_a_replica_that_just_ticked():
    Heartbeat("replica-1").beat()
    _replica("old", ago=3600, stopped=True)
    assert _health() == (
        0, "ok: 1 replica ticked within 30 s; no run pending more than 120 s past the slot\n", ""
    )


def test_no_replica_ever():
    assert _health() == (1, "", "unhealthy: no beat replica has ever ticked\n")


def test_every_replica_stopped():
    _replica("a", ago=5, stopped=True)
    _replica("b", ago=50, stopped=True)
    assert _health() == (1, "", "unhealthy: every beat replica is stopped (2 stopped)\n")


def test_no_recent_tick_names_the_newest_tick_age():
    _replica("killed", ago=100)
    _replica("stopped", ago=1, stopped=True)
    assert _health("--max-tick-age", "60") == (
        1, "", "unhealthy: no beat replica ticked within 60 s (newest tick 100 s ago)\n"
    )
    assert _health("--max-tick-age", "120")[0] == 0


def test_overdue_pending_run_and_every_reason_on_one_line(make_task):
    task = make_task(every=3600, name="nightly 'report'\nsecond line")
    slot = ledger.database_now() - timedelta(seconds=200)
    Run.objects.create(
        periodic_task=task, periodic_task_name=task.name, task=task.task, scheduled_for=slot,
        task_id="t-1",
    )
    _replica("a", ago=1, stopped=True)
    name = repr(task.name)
    overdue = (
        f"1 run pending more than 120 s past the slot (oldest: {name} scheduled for "
        f"{slot:%Y-%m-%d %H:%M:%S}.{slot.microsecond // 1000:03d} UTC)"
    )
    assert _health() == (
        1, "", f"unhealthy: every beat replica is stopped (1 stopped); {overdue}\n"
    )
    Heartbeat("replica-1").beat()
    assert _health() == (1, "", f"unhealthy: {overdue}\n")
    assert _health("--max-overdue", "300")[0] == 0


def test_local_looks_at_this_host_only():
    _replica("elsewhere", ago=1, host="another-host")
    here = socket.gethostname()
    assert _health("--local") == (
        1, "", f"unhealthy: no beat replica on host {here!r} has ever ticked\n"
    )
    Heartbeat("mine").beat()
    assert _health("--local")[0] == 0


def test_a_dispatched_run_nobody_republished_past_its_deadline_is_unhealthy(make_task, recorder):
    _replica("r1", ago=1)
    run = ledger.request_run(make_task(every=3600))
    claim(recorder)
    assert _health()[0] == 0
    # past the deadline (300 s) but within one reconcile pass (60 s) more: a replica will do it
    now = ledger.database_now()
    Run.objects.filter(pk=run.pk).update(dispatched_at=now - timedelta(seconds=350))
    assert _health()[0] == 0
    Run.objects.filter(pk=run.pk).update(dispatched_at=now - timedelta(seconds=361))
    assert _health() == (
        1, "", "unhealthy: 1 run dispatched and not started past the delivery deadline and a "
        "reconcile pass (nothing re-published them)\n",
    )
    Run.objects.filter(pk=run.pk).update(republished_at=now, republished=1)  # a replica did
    assert _health()[0] == 0


def test_the_healthy_line_counts_runs_closed_without_executing(make_task, recorder):
    _replica("r1", ago=1)
    runs = [ledger.request_run(make_task(every=3600)) for _ in range(3)]
    claim(recorder)
    now = ledger.database_now()
    reasons = (Run.Reason.NOT_DELIVERED, Run.Reason.NOT_DELIVERED, Run.Reason.WORKER_LOST)
    for run, reason in zip(runs, reasons, strict=True):
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.FAILED, reason=reason, finished_at=now
        )
    assert _health() == (
        0, "ok: 1 replica ticked within 30 s; no run pending more than 120 s past the slot; "
        '2 runs closed "not delivered" and 1 run closed "worker lost" in the last 24 h\n', "",
    )


@pytest.mark.parametrize("option", ["--max-overdue", "--max-tick-age"])
@pytest.mark.parametrize("value", ["-5", "0"])
def test_a_bound_of_zero_seconds_or_less_is_refused(option, value):
    with pytest.raises(CommandError, match=f"^{option} must be more than 0 seconds, got {value}$"):
        call_command("scheduling_health", option, value)
