"""Issue 5, acceptance 1: the chaos tool, bounded, on the suite's database and broker.

Five replicas and two workers, 60 s of seeded faults (SIGKILL + restart, SIGSTOP shorter and
longer than the idle-in-transaction timeout, pg_terminate_backend on the replicas' sessions; and
in the broker (issue 14): the queue purged, the broker connections of a replica or a worker cut,
on Redis the broker's database flushed), then every slot of the window checked: executed once or
recorded with its reason, no run lost after dispatch (invariant 9), "worker lost" only for tasks
of worker-loss policy fail whose body started. The tool gives its children a delivery deadline
of 10 s, so a message the broker lost is re-published within the settling time.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from tests.acceptance import deployment
from tools import chaos
from tools.brokers import Broker

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_bounded_chaos_run_loses_and_doubles_nothing(tmp_path):
    started = time.monotonic()
    options = chaos.Options(
        seconds=60, replicas=5, workers=2, tasks=40, every=2, seed=5, fault_every=2.5,
        cwd=deployment.ROOT, workdir=tmp_path,
        env={
            "DATABASE_URL": deployment.test_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SCHEDULING_IDLE_IN_TRANSACTION_TIMEOUT": "3",
            "SCHEDULING_WORKER_LOST_AFTER": "5",
            "SCHEDULING_RECONCILE_INTERVAL": "2",
            "CELERY_BROKER_VISIBILITY_TIMEOUT": "8",
        },
    )
    report = chaos.run(options)
    print(report.table())
    print(f"wall time {time.monotonic() - started:.0f} s")

    assert dict(report.breaches) == {kind: 0 for kind in report.breaches}
    assert [report.breaches[kind] for kind in chaos.Report.BREACHES] == [0] * len(
        chaos.Report.BREACHES
    )
    assert (report.duplicates, report.unaccounted) == (0, 0)
    assert sum(report.outcomes.values()) == report.slots
    assert report.slots >= 600  # 32 tasks every 2 s and 4 every minute, for a minute
    # Executed once, on its first message or (a message lost, or a queue deeper than the 10 s
    # deadline: the SQL broker's two workers can fall behind on a busy machine) after a re-publish.
    executed_once = report.outcomes["executed once"]
    executed_once += report.outcomes["executed once, after a re-publish"]
    assert executed_once >= report.slots // 2
    assert sum(report.faults.values()) >= 10
    assert {kind.split()[0] for kind in report.faults} == {"replica", "worker", "broker"}
    # What the suite's broker can take: Redis all, the SQL broker no flush, RabbitMQ on a shared
    # vhost only the purge (tools/brokers.py).
    offered = Broker(settings.CELERY_BROKER_URL, "queue").kinds
    broker = {"broker queue purged"}
    if "cut" in offered:
        broker |= {"broker connections of a replica cut", "broker connections of a worker cut"}
    if "flush" in offered:
        broker.add("broker database flushed")
    assert broker <= {kind for kind, n in report.faults.items() if n}
    assert report.policies["fail"] and report.policies["recover"]
