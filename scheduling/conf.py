"""Settings of the ``scheduling`` app: ``SCHEDULING_<NAME>`` in Django settings, read lazily.

Use ``from scheduling.conf import conf`` and read ``conf.<name>`` where the value is needed: every
read looks the Django setting up again, so ``override_settings`` works, and nothing is read at
import time. Each attribute of ``Conf`` is one setting (``conf.batch_size`` is
``SCHEDULING_BATCH_SIZE``): its default, the type the value is converted to, and what it means.
``DEFAULTS`` maps each setting's name without the prefix to that declaration.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar, overload

from django.conf import settings

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
    max_interval = Setting(0.5, float, (
        "Longest sleep between two ticks of a replica, in seconds: how long an edit, a run-now "
        "request or a new task may wait for the replicas to look (two polls a second, each one "
        "short indexed query, cost an idle replica nothing that shows)."
    ))
    batch_size = Setting(100, int, (
        "Most runs one claim transaction dispatches when the replica's claim before it was not "
        "full (the usual case: fewer runs due than this)."
    ))
    herd_batch_size = Setting(400, int, (
        "Most runs one claim dispatches in a herd: after a full claim a replica's next claim "
        "takes twice as many, up to this (the round trips of a claim are paid per claim, and on "
        "a busy machine each waits for a core); back to SCHEDULING_BATCH_SIZE after a claim "
        "that was not full. At or below SCHEDULING_BATCH_SIZE: claims never grow."
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
    reconcile_interval = Setting(60.0, float, (
        "Seconds between reconcile passes, besides the ones triggered by edits (each looks only "
        "at what the change log names; see FULL_RECONCILE_INTERVAL)."
    ))
    full_reconcile_interval = Setting(3600.0, float, (
        "Seconds between reconcile passes that check every periodic task (a safety net; the "
        "other passes look only at what the change log names)."
    ))
    overlap_stale_seconds = Setting(3600.0, float, (
        "Overlap policy skip: an unfinished run dispatched longer ago than this (seconds) no "
        "longer blocks the next one (a lost worker cannot block a task forever). Per task: "
        "TaskPolicy.overlap_stale_seconds."
    ))
    statement_timeout = Setting(5.0, float, (
        "statement_timeout of the scheduler's session, seconds."
    ))
    idle_in_transaction_timeout = Setting(10.0, float, (
        "idle_in_transaction_session_timeout of the scheduler's session, in seconds: how long a "
        "frozen replica can hold its claim before the server ends its transaction."
    ))
    tcp_keepalives_idle = Setting(5, int, (
        "TCP keepalive idle time of the scheduler's and the guard's sessions, seconds; probes "
        "every half of it, 3 of them, and tcp_user_timeout their sum: the keepalive bound "
        "(ledger.session.Keepalives, docs/outages.md)."
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
    retry_backoff_max = Setting(3.0, float, (
        "Longest wait between two attempts while the database or the broker is unreachable, in "
        "seconds (each wait is drawn between half and all of its bound): a replica resumes "
        "within about this long after an outage ends."
    ))
    broker_timeout = Setting(2.0, float, (
        "Connect and socket timeout of the scheduler's own broker connection (Redis, AMQP; "
        "connect only for the SQL transport), in seconds: a publish to a dead or frozen broker "
        "fails within about three times this (one reconnect), inside the claim's "
        "idle-in-transaction bound."
    ))
    reject_unknown_tasks = Setting(True, bool, (
        "Fail a run whose task name the beat process's Celery app does not know."
    ))
    heartbeat_interval = Setting(5.0, float, (
        "Seconds between two heartbeats of a replica (its row in the replicas page; display and "
        "health probes only). A replica is shown stale after 3 intervals without a tick."
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
        "Built-in prune: delete finished runs that finished longer ago than this (a duration "
        "such as '30d' or '12h', seconds, or a timedelta); unset: no built-in prune."
    ))
    prune_keep_last = Setting(0, int, (
        "Built-in prune: keep at least this many most recent finished runs of each task."
    ))
    prune_interval = Setting(3600.0, float, (
        "Seconds between two built-in prune passes of a replica."
    ))
    prune_batch_size = Setting(500, int, (
        "Most runs one built-in prune transaction deletes (one batch per idle tick; on a busy "
        "replica, one batch in at most a tenth of its time, sized to take about 2 ms)."
    ))
    success_deadline = Setting(None, _optional_seconds, (
        "Missed-run alerts: a scheduled run that has not succeeded this many seconds after its "
        "slot is overdue (signal, webhook, metric, health probe). Per task: "
        "TaskPolicy.success_deadline_seconds. Unset: no alert for tasks without their own."
    ))
    overdue_interval = Setting(1.0, float, (
        "Seconds between two overdue passes of a replica (each one bounded UPDATE, outside any "
        "claim transaction): a run is reported within its deadline plus about this long."
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

conf = Conf()
