"""Settings of the ``scheduling`` app: ``SCHEDULING_<NAME>`` in Django settings, read lazily.

Use ``from scheduling.conf import conf`` and read ``conf.<name>`` where the value is needed: every
read looks the Django setting up again, so ``override_settings`` works, and nothing is read at
import time. Each attribute of ``Conf`` is one setting (``conf.delivery_timeout`` is
``SCHEDULING_DELIVERY_TIMEOUT``): its default, the type the value is converted to, and what it
means.
``DEFAULTS`` maps each setting's name without the prefix to that declaration; ``REMOVED`` lists
the former settings (``INTERNAL``: those that are constants of ``scheduling.cadences`` now).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, NamedTuple, TypeVar, overload

from django.conf import settings

from scheduling import cadences
from scheduling.durations import parse_duration

T = TypeVar("T")


class Setting(Generic[T]):
    """One ``SCHEDULING_*`` setting: read on an instance, it is ``convert`` of the configured
    value, or of ``default`` when Django settings have none; read on the class, the declaration.
    """

    def __init__(self, default: object, convert: Callable[[Any], T], doc: str) -> None:
        self.default = default
        self.convert = convert
        self.doc = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name.upper()

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        return self.convert(getattr(settings, f"SCHEDULING_{self.name}", self.default))


def _replica_id(value: object) -> str:
    configured = value or os.environ.get("SCHEDULING_REPLICA_ID")
    return str(configured or f"{socket.gethostname()}:{os.getpid()}")


def _metrics_port(value: object) -> int | None:
    configured = value or os.environ.get("SCHEDULING_METRICS_PORT")
    return int(configured) if configured else None  # type: ignore[call-overload]


def _worker_lost_policy(value: object) -> str:
    policy = str(value)
    if policy not in ("fail", "recover"):
        raise ValueError(f"SCHEDULING_WORKER_LOST_POLICY must be 'fail' or 'recover', not {value!r}")
    return policy


def _optional_duration(value: object) -> timedelta | None:
    return None if value in (None, "") else parse_duration(value)


def _optional_seconds(value: object) -> float | None:
    return None if value in (None, "") else float(value)  # type: ignore[arg-type]


def _optional_text(value: object) -> str | None:
    return str(value) if value else None


class Conf:
    """Typed, lazy view of the SCHEDULING_* settings."""

    __slots__ = ()

    replica_id = Setting(None, _replica_id, (
        "Id of this beat replica; else the SCHEDULING_REPLICA_ID environment variable, else "
        "'hostname:pid'."
    ))
    prepared_claim = Setting(True, bool, (
        "Send the claim query as a server-side prepared statement (planned once per database "
        "session, not at every claim) where the connection keeps it: a direct connection, or a "
        "pooler that keeps prepared statements per client (PgBouncer 1.21+ with "
        "max_prepared_statements > 0), found by a probe per connection. False: never."
    ))
    direct_database = Setting("default", str, (
        "The DATABASES alias of a connection to PostgreSQL without a pooler, for the two "
        "session-level advisory locks: a replica's reconcile turn and the worker guard's "
        "execution locks. It must reach the same database as 'default'. Set it when 'default' "
        "goes through PgBouncer in transaction mode (system check scheduling.E003)."
    ))
    misfire_grace_seconds = Setting(60.0, float, (
        "A run dispatched later than this after its slot is a misfire (coalesced)."
    ))
    overlap_stale_seconds = Setting(3600.0, float, (
        "Every overlap policy but allow: an unfinished run dispatched "
        "longer ago than this (seconds) no longer holds the next one back (a lost worker cannot "
        "block a task forever; replace neither waits for it nor terminates it). Per task: "
        "TaskPolicy.overlap_stale_seconds."
    ))
    worker_lost_after = Setting(60.0, float, (
        "Seconds a running run's execution lock must stay free (its worker died) before the "
        "reconcile pass acts on it by the worker-loss policy: closed as failed, 'worker lost', or "
        "re-published."
    ))
    worker_lost_policy = Setting("fail", _worker_lost_policy, (
        "What happens to a run whose worker died mid-body: 'fail' (closed 'worker lost'; a "
        "redelivery does not run it again) or 'recover' (run again: re-published, or its "
        "redelivery runs). Per task: TaskPolicy.worker_lost_policy. A run whose body never "
        "started is always delivered again."
    ))
    delivery_timeout = Setting(300.0, float, (
        "Delivery deadline, in seconds: a dispatched run that no worker started within it is "
        "re-published with the same task id by a reconcile pass, at most once per deadline. Set "
        "it above the longest time a message may wait in the queue. Per task: "
        "TaskPolicy.delivery_timeout_seconds."
    ))
    republish_limit = Setting(3, int, (
        "Most re-publishes of one run (delivery deadline or worker-loss recovery); past it the run "
        "is closed as failed, 'not delivered' (or 'worker lost')."
    ))
    reject_unknown_tasks = Setting(True, bool, (
        "Fail a run whose task name the beat process's Celery app does not know."
    ))
    metrics_port = Setting(None, _metrics_port, (
        "Port on which each beat replica serves Prometheus metrics (/metrics); else the "
        "SCHEDULING_METRICS_PORT environment variable; unset: no metrics server."
    ))
    metrics_addr = Setting("127.0.0.1", str, (
        "Address the metrics server binds. The metrics answer without credentials: the default "
        "serves this host only; '0.0.0.0' serves every interface, for a private network only "
        "(docs/security.md)."
    ))
    metrics_task_labels = Setting(True, bool, (
        "Label metrics with the periodic task's name; False: one series for all tasks "
        "(task=\"*\"), for deployments with very many periodic tasks."
    ))
    prune_older_than = Setting(None, _optional_duration, (
        "Built-in prune: delete runs that finished longer ago than this (a duration "
        "such as '30d' or '12h', seconds, or a timedelta); unset: no built-in prune."
    ))
    prune_keep_last = Setting(0, int, (
        "Built-in prune: keep at least this many most recent finished runs of each task."
    ))
    success_deadline = Setting(None, _optional_seconds, (
        "Missed-run alerts: a scheduled run that has not succeeded this many seconds after its "
        "slot is overdue (signal, webhook, metric, health probe). Per task: "
        "TaskPolicy.success_deadline_seconds. Unset: no alert for tasks without their own."
    ))
    webhook_url = Setting(None, _optional_text, (
        "URL that receives one JSON document per run outcome and per overdue run (HTTP POST); "
        "unset: no webhook."
    ))
    webhook_timeout = Setting(5.0, float, (
        "Timeout of one webhook POST (connect and read), in seconds."
    ))
    webhook_retries = Setting(3, int, (
        "Most further attempts of a webhook POST that failed (no answer, or a 5xx or 429 "
        "status), each after a doubling wait from 0.5 s; then the event is logged and dropped."
    ))


#: Every setting by its name without the prefix (``"BATCH_SIZE"``), in declaration order.
DEFAULTS: dict[str, Setting[Any]] = {
    setting.name: setting for setting in vars(Conf).values() if isinstance(setting, Setting)
}

class RemovedSetting(NamedTuple):
    """A ``SCHEDULING_*`` setting this app no longer reads: system check ``scheduling.W003``
    warns while a deployment's settings still set it."""

    #: Its name without the prefix (``"BATCH_SIZE"``).
    name: str
    #: The setting that took its place, without the prefix (set that one instead); ``None``
    #: when none did.
    renamed_to: str | None
    #: The first release that no longer reads it.
    removed_in: str


#: Every removed or renamed setting, the one place they are listed. Each stays listed, and warns,
#: for at least one minor release after its ``removed_in`` (CHANGELOG.md; docs/configuration.md,
#: Removed settings). Those of the same name as a constant of ``scheduling.cadences`` became that
#: constant: internal cadences and bounds no deployment needs to tune.
REMOVED: tuple[RemovedSetting, ...] = (
    RemovedSetting("MAX_INTERVAL", None, "0.1.0"),
    RemovedSetting("BATCH_SIZE", None, "0.1.0"),
    RemovedSetting("RECONCILE_INTERVAL", None, "0.1.0"),
    RemovedSetting("FULL_RECONCILE_INTERVAL", None, "0.1.0"),
    RemovedSetting("STATEMENT_TIMEOUT", None, "0.1.0"),
    RemovedSetting("IDLE_IN_TRANSACTION_TIMEOUT", None, "0.1.0"),
    RemovedSetting("TCP_KEEPALIVES_IDLE", None, "0.1.0"),
    RemovedSetting("RETRY_BACKOFF_MAX", None, "0.1.0"),
    RemovedSetting("BROKER_TIMEOUT", None, "0.1.0"),
    RemovedSetting("HEARTBEAT_INTERVAL", None, "0.1.0"),
    RemovedSetting("PRUNE_INTERVAL", None, "0.1.0"),
    RemovedSetting("PRUNE_BATCH_SIZE", None, "0.1.0"),
    RemovedSetting("OVERDUE_INTERVAL", None, "0.1.0"),
    # A pause inside each claim for the tests, which their own scheduler class makes now.
    RemovedSetting("TEST_PAUSE_AFTER_PUBLISH", None, "0.1.0"),
)

#: The removed settings that are constants of ``scheduling.cadences`` now, of the same name.
INTERNAL: tuple[str, ...] = tuple(
    removed.name for removed in REMOVED if hasattr(cadences, removed.name)
)

conf = Conf()
