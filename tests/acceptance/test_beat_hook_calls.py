"""Every run a replica publishes passes once through Celery beat's hooks, as stock beat's do.

Three replicas wrap ``Scheduler.apply_entry``, ``Scheduler.apply_async`` and
``LedgerScheduler.apply_async`` at class level, as sentry-sdk wraps them
(``tests.acceptance.hooked_beat``), and log each call. Every run the ledger says was published is
seen exactly once by each hook, with the entry of its periodic task (name, Celery task, schedule,
args, kwargs, options); a paused task's runs and a run rejected for an unknown task name are
seen by none. Executions are counted from the worker's own log.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.models import Run
from tests.acceptance.deployment import Deployment, drain, executed_once, wait_until
from tests.acceptance.hooked_beat import PREFIX

# What the replicas hand to beat's hooks, not what the broker does with it: run once.
pytestmark = [
    pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)
]

REPLICAS = ("replica-1", "replica-2", "replica-3")
HOOKS = ("Scheduler.apply_entry", "LedgerScheduler.apply_async", "Scheduler.apply_async")
#: Seconds the replicas run once they are all up.
RUNNING = 10


def _hook_calls(deployment: Deployment) -> dict[str, list[dict]]:
    """The entries each hook was given in every replica, by hook."""
    calls = defaultdict(list)
    for replica in REPLICAS:
        for line in deployment.log_path(replica).read_text().splitlines():
            if PREFIX in line:
                hook, described = line.split(PREFIX, 1)[1].split(" ", 1)
                calls[hook].append(json.loads(described))
    return calls


def _expected_entry(run: Run) -> dict:
    """The entry of ``run`` as the hooks must see it: its periodic task's, with its task id."""
    task = PeriodicTask.objects.get(pk=run.periodic_task_id)
    options: dict = {
        "task_id": run.task_id,
        "headers": {
            **json.loads(task.headers), "scheduling_run": run.pk,
            "periodic_task_name": task.name, "scheduled_for": run.scheduled_for.isoformat(),
        },
    }
    if task.priority is not None:
        options["priority"] = task.priority
    return {
        "name": task.name, "task": task.task, "schedule": repr(task.schedule),
        "args": json.loads(task.args), "kwargs": json.loads(task.kwargs), "options": options,
    }


@pytest.mark.timeout(300)
def test_every_published_run_passes_once_through_each_beat_hook(
    deployment: Deployment, make_task
):
    start = ledger.database_now() + timedelta(seconds=3)
    published = [
        make_task(every=2, start_time=start, name="hooked plain", kwargs='{"label": "plain"}'),
        make_task(
            every=2, start_time=start, name="hooked options", args='["options", 0.1]',
            headers='{"tenant": "t1"}', priority=5,
        ),
        make_task(cron="* * * * *", name="hooked crontab", kwargs='{"label": "crontab"}'),
    ]
    paused = make_task(every=2, start_time=start, name="hooked paused")
    ledger.pause(paused, by="test", why="not published")
    unknown = make_task(every=2, start_time=start, name="hooked unknown", task="nowhere.unknown")
    for replica in REPLICAS:
        deployment.start_beat(replica, scheduler="tests.acceptance.hooked_beat:LedgerScheduler")
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()
    wait_until(
        lambda: Run.objects.filter(
            periodic_task__in=published[:2], dispatched_at__isnull=False
        ).count() >= 2 * RUNNING // 2,
        timeout=120,
    )
    deployment.stop(*REPLICAS)
    drain()
    deployment.stop("worker-1")

    runs = list(Run.objects.filter(dispatched_at__isnull=False))
    calls = _hook_calls(deployment)
    once = {run.task_id: 1 for run in runs}
    assert {hook: Counter(c["options"]["task_id"] for c in calls[hook]) for hook in HOOKS} == {
        hook: once for hook in HOOKS
    }
    by_id = {run.task_id: run for run in runs}
    assert [c for c in calls["Scheduler.apply_entry"]
            if c != _expected_entry(by_id[c["options"]["task_id"]])] == []
    assert {run.periodic_task_id for run in runs} <= {task.pk for task in published}
    assert Run.objects.filter(periodic_task=unknown, status=Run.Status.FAILED).exists()
    assert Run.objects.filter(periodic_task=paused, dispatched_at__isnull=False).count() == 0
    assert not [c for hook in HOOKS for c in calls[hook]
                if c["name"] in {paused.name, unknown.name}]
    executed_once(runs, deployment.executions())
