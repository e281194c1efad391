"""Issue 16, acceptance 5: a task whose worker is stopped turns overdue, reported once.

Two real beat replicas (each serving its metrics) and a real worker; the webhook posts to a real
local HTTP server in this process. While the worker runs, each run succeeds and its outcome is
posted (``run.finished``); once the worker is stopped, every run stays dispatched and turns
overdue within its deadline plus about one tick: one ``run.overdue`` document per run (from the
one replica that marked it), the counter summed over both replicas equals the overdue runs, the
gauge shows them on both replicas, and ``manage.py scheduling_health`` exits 1 naming the task.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask
from prometheus_client.parser import text_string_to_metric_families

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import ROOT, Deployment, wait_until
from tests.webhook_server import Hook

# The ledger's marks and the replicas' reports are the point; the broker in use is incidental.
pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)]

DEADLINE = 3
#: A replica's tick (cadences.MAX_INTERVAL, 0.5 s) plus its overdue interval (1 s), and room for a
#: loaded machine: the mark is never early (asserted exactly), and late by at most this.
TICK_BOUND = 4.0
REPLICAS = ("replica-1", "replica-2")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _samples(port: int, name: str) -> dict[str, float]:
    """{task label: value} of metric ``name`` on one replica's endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["task"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_a_task_whose_worker_is_stopped_turns_overdue_once(tmp_path, make_task):
    hook = Hook()
    ports = {name: _free_port() for name in REPLICAS}
    deployment = Deployment(tmp_path, SCHEDULING_WEBHOOK_URL=hook.url)
    try:
        for name in REPLICAS:
            deployment.start_beat(name, SCHEDULING_METRICS_PORT=str(ports[name]))
        deployment.start_worker("worker-1", concurrency=1)
        deployment.wait_ready()
        task = make_task(every=2, name="watched", kwargs=json.dumps({"label": "watched"}))
        TaskPolicy.objects.create(periodic_task=task, success_deadline_seconds=DEADLINE)

        succeeded = Run.objects.filter(periodic_task=task, status=Run.Status.SUCCEEDED)
        wait_until(lambda: succeeded.count() >= 2, 60)
        # the worker's pool process posts each outcome from a thread of its own; the stop below
        # signals the whole process group, which a pool process does not outlive to post it
        wait_until(lambda: len(hook.events("run.finished")) >= succeeded.count(), 30)
        announced = set(succeeded.values_list("pk", flat=True))
        deployment.stop("worker-1")  # a clean stop: the run it holds finishes first
        runs = Run.objects.filter(periodic_task=task)
        wait_until(
            lambda: runs.filter(overdue_at__isnull=False).count() >= 2, 30 + DEADLINE
        )
        PeriodicTask.objects.filter(pk=task.pk).update(enabled=False)  # no new runs
        wait_until(lambda: not runs.pending().exists(), 10)
        last_slot = runs.exclude(status=Run.Status.CANCELLED).latest("scheduled_for").scheduled_for
        wait_until(lambda: ledger.database_now() > last_slot + timedelta(seconds=DEADLINE + 5), 30)

        overdue = list(runs.filter(overdue_at__isnull=False).order_by("scheduled_for"))
        done = list(succeeded.order_by("scheduled_for"))
        # every run that did not succeed in time is overdue, none that did
        assert {run.pk for run in overdue} == set(
            runs.exclude(status__in=(Run.Status.SUCCEEDED, Run.Status.CANCELLED))
            .values_list("pk", flat=True)
        )
        assert all(run.status == Run.Status.DISPATCHED for run in overdue)
        assert done[-1].scheduled_for < overdue[0].scheduled_for  # all after the worker's last
        for run in overdue:  # never early, and within the bound plus about one tick
            late = (run.overdue_at - run.scheduled_for).total_seconds() - DEADLINE
            assert 0 <= late < TICK_BOUND, (run.scheduled_for, late)

        # the worker's log: each succeeded run executed once, the overdue ones never
        executed = [e["task_id"] for e in deployment.executions() if e["label"] == "watched"]
        assert sorted(executed) == sorted(run.task_id for run in done)

        # the webhook: one document per overdue run, one per outcome the worker recorded
        wait_until(lambda: len(hook.events("run.overdue")) >= len(overdue), 10)
        time.sleep(1.0)  # a second report, if any, would arrive now
        posted = hook.events("run.overdue")
        assert sorted(doc["run_id"] for doc in posted) == [run.pk for run in overdue]
        assert {doc["replica"] for doc in posted} <= set(REPLICAS)
        assert all(doc["periodic_task"] == "watched" for doc in posted)
        assert all(doc["deadline_seconds"] == float(DEADLINE) for doc in posted)
        finished = hook.events("run.finished")
        finished_ids = [doc["run_id"] for doc in finished]
        assert len(finished_ids) == len(set(finished_ids))  # each outcome posted once
        # every outcome before the stop; one recorded during the stop may not have been posted
        assert announced <= set(finished_ids) <= {run.pk for run in done}
        assert {doc["status"] for doc in finished} == {"succeeded"}

        # the metrics: the counter once per run over both replicas; the gauge on each
        counted = sum(
            _samples(ports[name], "scheduling_runs_overdue_total").get("watched", 0.0)
            for name in REPLICAS
        )
        assert counted == len(overdue)
        wait_until(
            lambda: all(
                _samples(ports[name], "scheduling_task_overdue_runs").get("watched")
                == len(overdue)
                for name in REPLICAS
            ),
            15,
        )

        # the health probe: exit 1, naming the task
        probe = subprocess.run(
            [sys.executable, "manage.py", "scheduling_health"], cwd=ROOT, env=deployment.env,
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert (probe.returncode, probe.stdout, probe.stderr) == (
            1, "", "unhealthy: 1 task overdue (no run succeeded within its deadline): 'watched'\n"
        )
    finally:
        deployment.stop()
        hook.close()
