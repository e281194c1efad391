"""Settings of the ``scheduling`` app, read lazily from Django settings with the prefix SCHEDULING_.

Use ``from scheduling.conf import conf`` and read attributes at call time, so ``override_settings``
works in tests. Every value has a default; none is read at import time.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings


@dataclass(frozen=True)
class _Setting:
    default: object
    doc: str


DEFAULTS: dict[str, _Setting] = {
    "REPLICA_ID": _Setting(
        None, "Id of this beat replica; else the SCHEDULING_REPLICA_ID environment variable, else "
        "'hostname:pid'."
    ),
    "MAX_INTERVAL": _Setting(1.0, "Longest sleep between two ticks of a replica, in seconds."),
    "BATCH_SIZE": _Setting(100, "Most runs one claim transaction dispatches."),
    "PREPARED_CLAIM": _Setting(
        True,
        "Send the claim query as a server-side prepared statement (planned once per database "
        "session, not at every claim). Set False behind a pooler that cannot keep prepared "
        "statements (PgBouncer in transaction mode before 1.21).",
    ),
    "MISFIRE_GRACE_SECONDS": _Setting(
        60.0, "A run dispatched later than this after its slot is a misfire (coalesced)."
    ),
    "RECONCILE_INTERVAL": _Setting(
        60.0, "Seconds between full reconcile passes, besides the ones triggered by edits."
    ),
    "FULL_RECONCILE_INTERVAL": _Setting(
        3600.0,
        "Seconds between reconcile passes that check every periodic task (a safety net; the "
        "other passes look only at what the change log names).",
    ),
    "OVERLAP_STALE_SECONDS": _Setting(
        3600.0,
        "Overlap policy skip: an unfinished run dispatched longer ago than this (seconds) no "
        "longer blocks the next one (a lost worker cannot block a task forever). Per task: "
        "TaskPolicy.overlap_stale_seconds.",
    ),
    "STATEMENT_TIMEOUT": _Setting(5.0, "statement_timeout of the scheduler's session, seconds."),
    "IDLE_IN_TRANSACTION_TIMEOUT": _Setting(
        10.0,
        "idle_in_transaction_session_timeout of the scheduler's session, in seconds: how long a "
        "frozen replica can hold its claim before the server ends its transaction.",
    ),
    "TCP_KEEPALIVES_IDLE": _Setting(5, "Server-side TCP keepalive idle time, seconds."),
    "WORKER_LOST_AFTER": _Setting(
        60.0,
        "Seconds a running run's execution lock must stay free (its worker died) before the "
        "reconcile pass closes it as failed, 'worker lost', unless a redelivery runs it again.",
    ),
    "RETRY_BACKOFF_MAX": _Setting(
        3.0,
        "Longest wait between two attempts while the database or the broker is unreachable, in "
        "seconds (each wait is drawn between half and all of its bound): a replica resumes "
        "within about this long after an outage ends.",
    ),
    "BROKER_TIMEOUT": _Setting(
        2.0,
        "Connect and socket timeout of the scheduler's own broker connection (Redis, AMQP; "
        "connect only for the SQL transport), in seconds: a publish to a dead or frozen broker "
        "fails within about three times this (one reconnect), inside the claim's "
        "idle-in-transaction bound.",
    ),
    "REJECT_UNKNOWN_TASKS": _Setting(
        True, "Fail a run whose task name the beat process's Celery app does not know."
    ),
    "HEARTBEAT_INTERVAL": _Setting(
        5.0,
        "Seconds between two heartbeats of a replica (its row in the replicas page; display and "
        "health probes only). A replica is shown stale after 3 intervals without a tick.",
    ),
    "METRICS_PORT": _Setting(
        None, "Port on which each beat replica serves Prometheus metrics (/metrics); else the "
        "SCHEDULING_METRICS_PORT environment variable; unset: no metrics server."
    ),
    "METRICS_ADDR": _Setting("0.0.0.0", "Address the metrics server binds."),
    "METRICS_TASK_LABELS": _Setting(
        True, "Label metrics with the periodic task's name; False: one series for all tasks "
        "(task=\"*\"), for deployments with very many periodic tasks."
    ),
    "PRUNE_OLDER_THAN": _Setting(
        None, "Built-in prune: delete finished runs that finished longer ago than this (a "
        "duration such as '30d' or '12h', seconds, or a timedelta); unset: no built-in prune."
    ),
    "PRUNE_KEEP_LAST": _Setting(
        0, "Built-in prune: keep at least this many most recent finished runs of each task."
    ),
    "PRUNE_INTERVAL": _Setting(3600.0, "Seconds between two built-in prune passes of a replica."),
    "PRUNE_BATCH_SIZE": _Setting(
        500, "Most runs one built-in prune transaction deletes (one batch per idle tick)."
    ),
}


class Conf:
    """Typed, lazy view of the SCHEDULING_* settings."""

    def _get(self, name: str) -> object:
        return getattr(settings, f"SCHEDULING_{name}", DEFAULTS[name].default)

    @property
    def replica_id(self) -> str:
        configured = self._get("REPLICA_ID") or os.environ.get("SCHEDULING_REPLICA_ID")
        return str(configured or f"{socket.gethostname()}:{os.getpid()}")

    @property
    def max_interval(self) -> float:
        return float(self._get("MAX_INTERVAL"))  # type: ignore[arg-type]

    @property
    def batch_size(self) -> int:
        return int(self._get("BATCH_SIZE"))  # type: ignore[arg-type]

    @property
    def prepared_claim(self) -> bool:
        return bool(self._get("PREPARED_CLAIM"))

    @property
    def misfire_grace_seconds(self) -> float:
        return float(self._get("MISFIRE_GRACE_SECONDS"))  # type: ignore[arg-type]

    @property
    def reconcile_interval(self) -> float:
        return float(self._get("RECONCILE_INTERVAL"))  # type: ignore[arg-type]

    @property
    def full_reconcile_interval(self) -> float:
        return float(self._get("FULL_RECONCILE_INTERVAL"))  # type: ignore[arg-type]

    @property
    def overlap_stale_seconds(self) -> float:
        return float(self._get("OVERLAP_STALE_SECONDS"))  # type: ignore[arg-type]

    @property
    def statement_timeout(self) -> float:
        return float(self._get("STATEMENT_TIMEOUT"))  # type: ignore[arg-type]

    @property
    def idle_in_transaction_timeout(self) -> float:
        return float(self._get("IDLE_IN_TRANSACTION_TIMEOUT"))  # type: ignore[arg-type]

    @property
    def tcp_keepalives_idle(self) -> int:
        return int(self._get("TCP_KEEPALIVES_IDLE"))  # type: ignore[arg-type]

    @property
    def worker_lost_after(self) -> float:
        return float(self._get("WORKER_LOST_AFTER"))  # type: ignore[arg-type]

    @property
    def retry_backoff_max(self) -> float:
        return float(self._get("RETRY_BACKOFF_MAX"))  # type: ignore[arg-type]

    @property
    def broker_timeout(self) -> float:
        return float(self._get("BROKER_TIMEOUT"))  # type: ignore[arg-type]

    @property
    def reject_unknown_tasks(self) -> bool:
        return bool(self._get("REJECT_UNKNOWN_TASKS"))

    @property
    def heartbeat_interval(self) -> float:
        return float(self._get("HEARTBEAT_INTERVAL"))  # type: ignore[arg-type]

    @property
    def metrics_port(self) -> int | None:
        configured = self._get("METRICS_PORT") or os.environ.get("SCHEDULING_METRICS_PORT")
        return int(configured) if configured else None  # type: ignore[call-overload]

    @property
    def metrics_addr(self) -> str:
        return str(self._get("METRICS_ADDR"))

    @property
    def metrics_task_labels(self) -> bool:
        return bool(self._get("METRICS_TASK_LABELS"))

    @property
    def prune_older_than(self) -> timedelta | None:
        from scheduling.retention import parse_duration

        value = self._get("PRUNE_OLDER_THAN")
        return None if value in (None, "") else parse_duration(value)

    @property
    def prune_keep_last(self) -> int:
        return int(self._get("PRUNE_KEEP_LAST"))  # type: ignore[call-overload]

    @property
    def prune_interval(self) -> float:
        return float(self._get("PRUNE_INTERVAL"))  # type: ignore[arg-type]

    @property
    def prune_batch_size(self) -> int:
        return int(self._get("PRUNE_BATCH_SIZE"))  # type: ignore[call-overload]


conf = Conf()
