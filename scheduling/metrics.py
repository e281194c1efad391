"""Prometheus metrics of the replicas and of the worker guard (prometheus-client).

Every metric is prefixed ``scheduling_``; labels are ``task`` (the periodic task's name, or
``"*"`` with ``SCHEDULING_METRICS_TASK_LABELS = False``), ``replica`` (the beat replica's id) and,
for the guard, ``worker`` (the Celery worker's node name):

- ``scheduling_runs_dispatched_total{task, replica, trigger}``: runs this replica committed as
  dispatched (``trigger``: schedule, manual or backfill);
- ``scheduling_run_lateness_seconds{task, replica}``: histogram of dispatched_at - due_at
  of dispatched scheduled runs (manual and backfill runs are due when created or in the past);
- ``scheduling_misfired_slots_total{task, replica, outcome}``: slots of runs claimed later than
  their grace period: ``missed`` (recorded missed), ``coalesced`` (the slots a coalesced run
  stands for), ``caught_up`` (dispatched late, one by one, under catch up);
- ``scheduling_runs_skipped_total{task, replica}``: runs recorded skipped by the overlap policy;
- ``scheduling_runs_buffered_total{task, replica}``: runs recorded buffered by an overlap
  policy that buffers (``TaskPolicy.BUFFERING``; each waits for its task's unfinished run, and counts again
  if buffered again);
- ``scheduling_runs_replaced_total{task, replica}``: unfinished runs ended by overlap policy
  replace for a newer slot (not started: skipped; started: revoked with terminate);
- ``scheduling_duplicates_suppressed_total{task, worker}``: duplicate deliveries the worker guard
  dropped (``scheduling.guard``);
- ``scheduling_runs_republished_total{task, replica, cause}``: runs a replica published again
  with their task id: ``deadline`` (no worker started it within the delivery deadline) or
  ``recover`` (its worker died mid-body, worker-loss policy recover);
- ``scheduling_runs_not_executed_total{task, replica, reason}``: runs a replica closed without
  them executing to the end: ``not delivered``, ``worker lost``, ``rejected before dispatch``;
- ``scheduling_runs_overdue_total{task, replica}``: runs this replica found overdue (not succeeded
  within their task's success deadline; ``scheduling.overdue_watch``): each overdue run is counted by
  one replica only, so the sum over replicas is the number of overdue runs;
- ``scheduling_task_overdue_runs{task}``: a gauge, the overdue runs of the task since its last
  success (0 when it is not overdue), read from the ledger by every replica (take ``max by
  (task)``); the shipped alerting rules (``scheduling/prometheus/alerts.yml``) use both;
- ``scheduling_claim_seconds{replica}``: histogram of the claim transaction's duration (lock,
  publish, mark dispatched, plan the next, commit), empty claims included.

A beat replica serves them over HTTP when ``SCHEDULING_METRICS_PORT`` is set (``serve``). With
the environment variable ``PROMETHEUS_MULTIPROC_DIR`` set (prometheus-client's multiprocess
mode), every process of a container writes its values into that folder and the replica's port
serves them all, summed: the workers' pool processes included.

A beat replica records its metrics only when one of the two is set (``recording``): otherwise
nothing can read them, and recording is not free. The guard's counter is always recorded: it
counts rare events, and a worker may serve its pool processes' metrics its own way
(docs/operating.md, "Metrics"). A labelled series is built the first time its task is
seen, a histogram's with all its buckets: in a replica's first pass over 10,000 tasks that was a
tenth of its CPU in a burst, profiled, and each series stays in memory for good.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from scheduling.conf import conf

if TYPE_CHECKING:
    from scheduling.health import OverdueTask
    from scheduling.ledger import Dispatched, Overdue, Redelivered

logger = logging.getLogger(__name__)

#: Lateness buckets, seconds: on time is milliseconds; a misfire is past the grace (60 s).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

RUNS_DISPATCHED = Counter(
    "scheduling_runs_dispatched", "Runs this replica committed as dispatched.",
    ["task", "replica", "trigger"],
)
LATENESS = Histogram(
    "scheduling_run_lateness_seconds",
    "dispatched_at - due_at (the slot plus its jitter) of the scheduled runs this replica "
    "dispatched, seconds.",
    ["task", "replica"], buckets=LATENESS_BUCKETS,
)
MISFIRED_SLOTS = Counter(
    "scheduling_misfired_slots",
    "Slots of runs claimed later than their grace period, by what the misfire policy did.",
    ["task", "replica", "outcome"],
)
RUNS_SKIPPED = Counter(
    "scheduling_runs_skipped", "Runs recorded skipped by the overlap policy.", ["task", "replica"]
)
RUNS_BUFFERED = Counter(
    "scheduling_runs_buffered",
    "Runs recorded buffered behind their task's unfinished run (an overlap policy that waits).",
    ["task", "replica"],
)
RUNS_REPLACED = Counter(
    "scheduling_runs_replaced",
    "Unfinished runs ended by overlap policy replace for a newer slot (skipped, or terminated).",
    ["task", "replica"],
)
DUPLICATES_SUPPRESSED = Counter(
    "scheduling_duplicates_suppressed",
    "Duplicate deliveries of a run dropped by the worker guard without running the body.",
    ["task", "worker"],
)
RUNS_REPUBLISHED = Counter(
    "scheduling_runs_republished",
    "Runs this replica published again with their task id, by cause (deadline, recover).",
    ["task", "replica", "cause"],
)
RUNS_NOT_EXECUTED = Counter(
    "scheduling_runs_not_executed",
    "Runs this replica closed without them executing to the end, by reason.",
    ["task", "replica", "reason"],
)
RUNS_OVERDUE = Counter(
    "scheduling_runs_overdue",
    "Runs this replica found not succeeded within their task's success deadline.",
    ["task", "replica"],
)
TASK_OVERDUE_RUNS = Gauge(
    "scheduling_task_overdue_runs",
    "Overdue runs of the task since its last success (0: not overdue), from the ledger.",
    ["task"], multiprocess_mode="livemax",
)
#: The task labels this process set the gauge for, so a task no longer overdue goes back to 0.
_overdue_labels: set[str] = set()
CLAIM_SECONDS = Histogram(
    "scheduling_claim_seconds", "Duration of one claim transaction, seconds.", ["replica"],
    buckets=CLAIM_BUCKETS,
)


def recording() -> bool:
    """Whether this process records a replica's metrics: ``SCHEDULING_METRICS_PORT`` or the
    environment variable ``PROMETHEUS_MULTIPROC_DIR`` is set (module doc). Read at every observation, so a
    setting changed at run time (``override_settings``) takes effect."""
    return conf.metrics_port is not None or bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _task(name: str) -> str:
    return name if conf.metrics_task_labels else "*"


def observe_claim(dispatched: Iterable[Dispatched], replica: str, seconds: float) -> None:
    """Count what one claim transaction committed (``ledger.claim_and_dispatch``'s result).

    ``seconds`` is the transaction's duration, measured with ``time.monotonic()``.
    """
    if not recording():
        return
    try:
        _observe_claim(dispatched, replica, seconds)
    except Exception:  # noqa: BLE001 - metrics must never stop a replica
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def _observe_claim(dispatched: Iterable[Dispatched], replica: str, seconds: float) -> None:
    from scheduling.models import Run

    CLAIM_SECONDS.labels(replica).observe(seconds)
    labelled = conf.metrics_task_labels
    for item in dispatched:
        task = item.periodic_task_name if labelled else "*"
        if item.status == Run.Status.DISPATCHED:
            RUNS_DISPATCHED.labels(task, replica, item.trigger).inc()
            if item.trigger == Run.Trigger.SCHEDULE and item.lateness is not None:
                LATENESS.labels(task, replica).observe(item.lateness)
        elif item.status == Run.Status.SKIPPED:
            RUNS_SKIPPED.labels(task, replica).inc()
        elif item.status == Run.Status.BUFFERED:
            RUNS_BUFFERED.labels(task, replica).inc()
        if item.replaced:
            RUNS_REPLACED.labels(task, replica).inc(item.replaced)
        if item.misfire:
            MISFIRED_SLOTS.labels(task, replica, item.misfire).inc(item.misfired_slots)


def observe_redelivery(done: Redelivered, replica: str) -> None:
    """Count what one redelivery pass did (``ledger.redeliver``'s result)."""
    if not recording():
        return
    try:
        for cause, task_ids in (("deadline", done.republished), ("recover", done.recovered)):
            for task_id in task_ids:
                RUNS_REPUBLISHED.labels(_task(done.names[task_id]), replica, cause).inc()
        for task_id in done.closed:
            RUNS_NOT_EXECUTED.labels(
                _task(done.names[task_id]), replica, done.reasons[task_id]
            ).inc()
    except Exception:  # noqa: BLE001 - metrics must never stop a replica
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def observe_worker_lost(names: Iterable[str], replica: str) -> None:
    """Count runs the lost-worker sweep closed as "worker lost" (their periodic tasks' names)."""
    if not recording():
        return
    try:
        for name in names:
            RUNS_NOT_EXECUTED.labels(_task(name), replica, "worker lost").inc()
    except Exception:  # noqa: BLE001 - metrics must never stop a replica
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def observe_overdue(found: Iterable[Overdue], replica: str) -> None:
    """Count the runs one overdue pass of this replica marked (``ledger.mark_overdue``)."""
    if not recording():
        return
    try:
        for run in found:
            RUNS_OVERDUE.labels(_task(run.periodic_task_name), replica).inc()
    except Exception:  # noqa: BLE001 - metrics must never stop a replica
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def observe_overdue_tasks(tasks: Iterable[OverdueTask]) -> None:
    """Set the overdue gauge to the tasks overdue now (``health.overdue_tasks``), others to 0."""
    if not recording():
        return
    try:
        current: dict[str, int] = {}
        for task in tasks:
            label = _task(task.name)
            current[label] = current.get(label, 0) + task.runs
        for label in _overdue_labels - current.keys():
            TASK_OVERDUE_RUNS.labels(label).set(0)
        for label, runs in current.items():
            TASK_OVERDUE_RUNS.labels(label).set(runs)
        _overdue_labels.update(current)
    except Exception:  # noqa: BLE001 - metrics must never stop a replica
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def observe_suppressed(periodic_task_name: str, worker: str) -> None:
    """Count one duplicate delivery the worker guard dropped."""
    try:
        DUPLICATES_SUPPRESSED.labels(_task(periodic_task_name), worker).inc()
    except Exception:  # noqa: BLE001 - metrics must never change what the guard decided
        logger.exception("cannot record metrics", extra={"action": "metrics_failed"})


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve the metrics over HTTP on ``addr:port`` (path ``/metrics``) from a daemon thread.

    The server asks for no credentials, so it binds the loopback address unless told otherwise
    (``SCHEDULING_METRICS_ADDR``; how to expose it safely: docs/security.md).

    Under prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) the values
    every process sharing that folder wrote are served, summed per label set; otherwise
    this process's own. A port that cannot be bound is logged as an error; the replica runs on
    without metrics (they are never needed for correctness).
    """
    registry: CollectorRegistry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        logger.error(
            "cannot serve metrics on %s:%d: %s", addr, port, exc, extra={"action": "metrics_failed"}
        )
        return
    logger.info(
        "metrics on http://%s:%d/metrics%s", addr, port,
        " (multiprocess mode)" if registry is not REGISTRY else "",
        extra={"action": "metrics"},
    )
