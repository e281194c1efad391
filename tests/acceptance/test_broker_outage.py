"""Issue 5 acceptance 4: the broker unreachable for 20 s while beat replicas run.

Two real beat replicas publish through a TCP proxy (``tests.tcp_proxy``) in front of the broker
(Redis, RabbitMQ, or the embedded PostgreSQL that kombu's SQL transport uses); the worker
consumes directly. The proxy is cut for 20 s: open connections closed, new ones refused. Nothing may be
marked dispatched during the outage, a publish failure must roll its claim back, and after the
broker returns every due run is dispatched once, as its misfire policy says.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.conf import settings
from django_celery_beat.models import PeriodicTask

from scheduling import ledger
from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, drain, wait_until
from tests.acceptance.outages import assert_misfire_policies
from tests.tcp_proxy import TcpProxy, proxied_broker_url

pytestmark = [pytest.mark.acceptance, pytest.mark.broker, pytest.mark.django_db(transaction=True)]

OUTAGE_SECONDS = 20
EVERY = timedelta(seconds=1)
GRACE = timedelta(seconds=5)
RESUME_BOUND = 5.0
ADOPTED = "adopted by the worker"


def _rows(task: PeriodicTask) -> list[Run]:
    return list(Run.objects.filter(periodic_task=task).order_by("scheduled_for"))


def test_broker_cut_for_20_s_dispatches_nothing_meanwhile_and_everything_after(
    deployment: Deployment, make_task
):
    template, upstream = proxied_broker_url(settings.CELERY_BROKER_URL)
    proxy = TcpProxy(upstream)
    replicas = ["replica-1", "replica-2"]
    try:
        for name in replicas:
            deployment.start_beat(name, CELERY_BROKER_URL=template.format(port=proxy.port))
        deployment.start_worker("worker-1", concurrency=4)
        deployment.wait_ready()

        start = ledger.database_now() + timedelta(seconds=2)
        tasks: dict[str, PeriodicTask] = {}
        for policy in ("coalesce", "skip"):
            tasks[policy] = make_task(every=1, start_time=start, name=f"broker-{policy}")
            TaskPolicy.objects.create(
                periodic_task=tasks[policy],
                misfire_policy=policy,
                misfire_grace_seconds=int(GRACE.total_seconds()),
            )
        # default policy (coalesce, 60 s grace): a 20 s outage is inside the grace
        tasks["in_grace"] = make_task(every=1, start_time=start, name="broker-in-grace")
        wait_until(lambda: Run.objects.filter(status="succeeded").count() >= 8, timeout=30)

        cut = ledger.database_now()
        proxy.cut()
        one_off = make_task(clocked=cut + timedelta(seconds=OUTAGE_SECONDS / 2), name="one-off")
        time.sleep(OUTAGE_SECONDS)
        during = list(Run.objects.filter(dispatched_at__gt=cut))
        restored = ledger.database_now()
        proxy.restore()
        due_at_return = Run.objects.pending().filter(scheduled_for__lte=restored)
        assert due_at_return.exists()
        wait_until(lambda: not due_at_return.exists(), timeout=15)
        time.sleep(2)
        alive = {name: deployment.processes[name].poll() for name in replicas}
        deployment.stop(*replicas)
        drain()
        deployment.stop("worker-1")
    finally:
        proxy.close()

    assert alive == {name: None for name in replicas}  # no replica exited
    after_return = Run.objects.filter(dispatched_at__gte=restored).exclude(claimed_by="")

    # Nothing a replica marked dispatched during the outage. The only exception the invariant
    # allows: a message published just before the cut whose commit was cut off, adopted by the
    # worker (which reaches the broker directly) with its own dispatch time.
    assert [r for r in during if not r.reason.startswith(ADOPTED)] == []
    assert len(during) <= 1 and all(r.scheduled_for < cut for r in during)

    # Each replica that tried to publish during the outage logged it once, and the recovery
    # once when it next published (the other replica may have won every claim since). A failed
    # publish rolled its claim back: that run's outcome (dispatched, or missed under skip) was
    # decided after the broker returned.
    failed_publishes = []
    logged = {}
    for name in replicas:
        log = deployment.log_path(name).read_text()
        down = re.findall(r"broker unavailable, retrying with backoff: (.*)", log)
        back = re.findall(r"broker reachable again after \d+ failed ticks", log)
        published_after = after_return.filter(claimed_by=name).exists()
        logged[name] = (len(down), len(back), published_after)
        assert logged[name] in ((1, 1, True), (1, 0, False), (0, 0, True), (0, 0, False)), name
        failed_publishes += [  # one run, or the runs of a Redis pipeline that failed
            task_id for d in down for ids in re.findall(r"^cannot publish runs? ([^:]+):", d)
            for task_id in ids.split(", ")
        ]
    assert sum(n for n, _, _ in logged.values()) >= 1, logged
    assert failed_publishes, "no replica saw its publish fail at the cut"
    for task_id in failed_publishes:
        rolled_back = Run.objects.get(task_id=task_id)
        assert rolled_back.claimed_by in replicas
        assert (rolled_back.dispatched_at or rolled_back.finished_at) >= restored

    # Runs resume within RESUME_BOUND seconds of the broker returning.
    resumed = min(after_return.values_list("dispatched_at", flat=True))
    print(f"first dispatch {(resumed - restored).total_seconds():.3f} s after the broker returned")
    assert (resumed - restored).total_seconds() < RESUME_BOUND

    # Misfire policies, exact counts from the ledger.
    assert_misfire_policies(
        {policy: _rows(task) for policy, task in tasks.items()},
        start=start, every=EVERY, grace=GRACE, down=cut, up=restored,
        publish_slack=timedelta(seconds=RESUME_BOUND),
    )

    one_off.refresh_from_db()
    ((status, dispatched_at),) = Run.objects.filter(periodic_task=one_off).values_list(
        "status", "dispatched_at"
    )
    assert (status, one_off.enabled) == (Run.Status.SUCCEEDED, False)
    assert dispatched_at >= restored

    # Nothing executed twice; everything dispatched executed once.
    executed = Counter(e["task_id"] for e in deployment.executions())
    assert [tid for tid, n in executed.items() if n > 1] == []
    dispatched = Run.objects.exclude(dispatched_at=None)
    assert set(executed) == set(dispatched.values_list("task_id", flat=True))
    assert Run.objects.exclude(status__in=("succeeded", "missed", "pending")).count() == 0
