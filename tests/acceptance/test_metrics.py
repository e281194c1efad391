"""Issue 7, acceptance 2: a real replica's metrics endpoint agrees with the ledger.

One beat replica serves ``SCHEDULING_METRICS_PORT``; it and a worker share a
``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode, as docs/operating.md documents
for a container running both), so the replica's endpoint also shows what the worker's pool
processes counted. After the tasks are disabled and the ledger is still, one scrape over HTTP
must equal what the ledger says per task.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
from django.db.models import Sum
from django_celery_beat.models import PeriodicTask
from prometheus_client.parser import text_string_to_metric_families

from scheduling.models import Run, TaskPolicy
from tests.acceptance.deployment import Deployment, drain, wait_until

# The values come from the claim's result and the guard's decision, whatever the broker.
pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)]

REPLICA = "replica-m"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_endpoint_matches_the_ledger(deployment: Deployment, tmp_path, make_task):
    port = _free_port()
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    deployment.env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)  # beat and worker alike
    deployment.start_beat(REPLICA, SCHEDULING_METRICS_PORT=str(port))
    deployment.start_worker("worker-1", concurrency=2)
    deployment.wait_ready()

    on_time = make_task(every=1, name="on-time")
    missed = make_task(every=1, name="missed")  # grace 0: every run is a misfire
    TaskPolicy.objects.create(
        periodic_task=missed, misfire_policy=TaskPolicy.Misfire.SKIP, misfire_grace_seconds=0
    )
    coalesced = make_task(every=1, name="coalesced")
    TaskPolicy.objects.create(periodic_task=coalesced, misfire_grace_seconds=0)
    overlapping = make_task(every=1, name="overlapping", kwargs=json.dumps({"sleep": 2.5}))
    TaskPolicy.objects.create(periodic_task=overlapping, overlap_policy=TaskPolicy.Overlap.SKIP)
    tasks = [on_time, missed, coalesced, overlapping]

    time.sleep(6)
    PeriodicTask.objects.filter(pk__in=[t.pk for t in tasks]).update(enabled=False)
    wait_until(lambda: not Run.objects.pending().exists(), 10)
    drain()
    duplicate = Run.objects.filter(periodic_task=on_time, status=Run.Status.SUCCEEDED).first()
    deployment.publish_copy(duplicate)
    wait_until(lambda: Run.objects.get(pk=duplicate.pk).suppressed == 1, 30)
    time.sleep(1.5)  # past the replica's last tick and metrics update
    samples = _scrape(port)
    # one server per replica process (beat's banner builds a second, lazy scheduler)
    log = deployment.log_path(REPLICA).read_text()
    assert (log.count("metrics on http://"), log.count("cannot serve metrics")) == (1, 0)

    def value(name: str, **labels: str) -> float:
        return samples.get((name, frozenset(labels.items())), 0.0)

    mine = Run.objects.filter(claimed_by=REPLICA)
    for task in tasks:
        runs = mine.filter(periodic_task=task)
        sent = runs.filter(dispatched_at__isnull=False)
        lateness = sum((r.lateness.total_seconds() for r in sent), 0.0)
        labels = {"task": task.name, "replica": REPLICA}
        assert value("scheduling_runs_dispatched_total", trigger="schedule", **labels) \
            == sent.count(), task.name
        assert value("scheduling_run_lateness_seconds_count", **labels) == sent.count()
        assert value("scheduling_run_lateness_seconds_sum", **labels) \
            == pytest.approx(lateness, abs=1e-5)
        assert value("scheduling_runs_skipped_total", **labels) \
            == runs.filter(status=Run.Status.SKIPPED).count()
        assert value("scheduling_misfired_slots_total", outcome="missed", **labels) \
            == (runs.filter(status=Run.Status.MISSED).aggregate(n=Sum("slots"))["n"] or 0)
        assert value("scheduling_misfired_slots_total", outcome="coalesced", **labels) \
            == (runs.filter(reason__startswith="misfire: coalesced")
                .aggregate(n=Sum("slots"))["n"] or 0)

    # Every kind happened, so the equalities above compared something.
    assert mine.filter(periodic_task=on_time, dispatched_at__isnull=False).count() >= 3
    assert mine.filter(periodic_task=missed, status=Run.Status.MISSED).count() >= 3
    assert mine.filter(periodic_task=coalesced, reason__startswith="misfire: coalesced").count() \
        >= 3
    assert mine.filter(periodic_task=overlapping, status=Run.Status.SKIPPED).count() >= 1
    assert value(
        "scheduling_duplicates_suppressed_total", task="on-time", worker=duplicate.worker
    ) == 1
    claims = value("scheduling_claim_seconds_count", replica=REPLICA)
    # Each run of a 1 s interval task was claimed in a transaction of its own.
    assert claims >= mine.filter(periodic_task=on_time).count()
    assert 0 < value("scheduling_claim_seconds_sum", replica=REPLICA) < claims * 5.0
