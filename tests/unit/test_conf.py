"""conf: every SCHEDULING_* setting read when its attribute is read, converted to its type."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings

from scheduling.conf import DEFAULTS, conf


@pytest.fixture(autouse=True)
def _no_environment_fallbacks(monkeypatch):
    monkeypatch.delenv("SCHEDULING_REPLICA_ID", raising=False)
    monkeypatch.delenv("SCHEDULING_METRICS_PORT", raising=False)


def test_every_setting_is_read_through_override_settings_and_converted():
    configured = {
        "REPLICA_ID": 7, "MAX_INTERVAL": "2", "BATCH_SIZE": "7", "HERD_BATCH_SIZE": "70",
        "PREPARED_CLAIM": 0,
        "DIRECT_DATABASE": "direct",
        "MISFIRE_GRACE_SECONDS": 30, "RECONCILE_INTERVAL": "5", "FULL_RECONCILE_INTERVAL": 60,
        "OVERLAP_STALE_SECONDS": "120", "STATEMENT_TIMEOUT": 1, "IDLE_IN_TRANSACTION_TIMEOUT": 2,
        "TCP_KEEPALIVES_IDLE": "3", "WORKER_LOST_AFTER": 10, "WORKER_LOST_POLICY": "recover",
        "DELIVERY_TIMEOUT": "30", "REPUBLISH_LIMIT": "2", "RETRY_BACKOFF_MAX": 1,
        "BROKER_TIMEOUT": "0.5", "REJECT_UNKNOWN_TASKS": "", "HEARTBEAT_INTERVAL": 1,
        "METRICS_PORT": "9100", "METRICS_ADDR": "127.0.0.1", "METRICS_TASK_LABELS": 0,
        "PRUNE_OLDER_THAN": "12h", "PRUNE_KEEP_LAST": "3", "PRUNE_INTERVAL": 60,
        "PRUNE_BATCH_SIZE": "50", "SUCCESS_DEADLINE": "90", "OVERDUE_INTERVAL": "0.5",
        "WEBHOOK_URL": "http://127.0.0.1:1/hook", "WEBHOOK_TIMEOUT": 2, "WEBHOOK_RETRIES": "1",
    }
    assert set(configured) == set(DEFAULTS)
    with override_settings(**{f"SCHEDULING_{name}": value for name, value in configured.items()}):
        read = {name: getattr(conf, name.lower()) for name in DEFAULTS}
    assert {name: (type(value), value) for name, value in read.items()} == {
        "REPLICA_ID": (str, "7"), "MAX_INTERVAL": (float, 2.0), "BATCH_SIZE": (int, 7),
        "HERD_BATCH_SIZE": (int, 70),
        "PREPARED_CLAIM": (bool, False), "DIRECT_DATABASE": (str, "direct"),
        "MISFIRE_GRACE_SECONDS": (float, 30.0),
        "RECONCILE_INTERVAL": (float, 5.0), "FULL_RECONCILE_INTERVAL": (float, 60.0),
        "OVERLAP_STALE_SECONDS": (float, 120.0), "STATEMENT_TIMEOUT": (float, 1.0),
        "IDLE_IN_TRANSACTION_TIMEOUT": (float, 2.0), "TCP_KEEPALIVES_IDLE": (int, 3),
        "WORKER_LOST_AFTER": (float, 10.0), "WORKER_LOST_POLICY": (str, "recover"),
        "DELIVERY_TIMEOUT": (float, 30.0), "REPUBLISH_LIMIT": (int, 2),
        "RETRY_BACKOFF_MAX": (float, 1.0),
        "BROKER_TIMEOUT": (float, 0.5), "REJECT_UNKNOWN_TASKS": (bool, False),
        "HEARTBEAT_INTERVAL": (float, 1.0), "METRICS_PORT": (int, 9100),
        "METRICS_ADDR": (str, "127.0.0.1"), "METRICS_TASK_LABELS": (bool, False),
        "PRUNE_OLDER_THAN": (timedelta, timedelta(hours=12)), "PRUNE_KEEP_LAST": (int, 3),
        "PRUNE_INTERVAL": (float, 60.0), "PRUNE_BATCH_SIZE": (int, 50),
        "SUCCESS_DEADLINE": (float, 90.0), "OVERDUE_INTERVAL": (float, 0.5),
        "WEBHOOK_URL": (str, "http://127.0.0.1:1/hook"), "WEBHOOK_TIMEOUT": (float, 2.0),
        "WEBHOOK_RETRIES": (int, 1),
    }


def test_the_replica_id_is_the_setting_else_the_environment_else_host_and_pid(monkeypatch):
    with override_settings(SCHEDULING_REPLICA_ID=None):
        unset = conf.replica_id
        monkeypatch.setenv("SCHEDULING_REPLICA_ID", "from-env")
        from_env = conf.replica_id
    with override_settings(SCHEDULING_REPLICA_ID="from-settings"):
        from_settings = conf.replica_id
    assert (unset, from_env, from_settings) == (
        f"{socket.gethostname()}:{os.getpid()}", "from-env", "from-settings"
    )


def test_the_metrics_port_is_the_setting_else_the_environment_else_none(monkeypatch):
    with override_settings(SCHEDULING_METRICS_PORT=None):
        unset = conf.metrics_port
        monkeypatch.setenv("SCHEDULING_METRICS_PORT", "9200")
        from_env = conf.metrics_port
    with override_settings(SCHEDULING_METRICS_PORT=9300):
        from_settings = conf.metrics_port
    assert (unset, from_env, from_settings) == (None, 9200, 9300)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("30d", timedelta(days=30)), (90, timedelta(seconds=90)),
     (timedelta(hours=1), timedelta(hours=1))],
)
def test_prune_older_than_is_a_duration_or_none(value, expected):
    with override_settings(SCHEDULING_PRUNE_OLDER_THAN=value):
        assert conf.prune_older_than == expected


def test_a_bad_duration_is_an_error_when_read():
    with override_settings(SCHEDULING_PRUNE_OLDER_THAN="30 days"), pytest.raises(ValueError):
        conf.prune_older_than  # noqa: B018


def test_importing_conf_reads_no_settings():
    """Without DJANGO_SETTINGS_MODULE any read of a setting raises ImproperlyConfigured."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", "from scheduling.conf import DEFAULTS, conf; print(len(DEFAULTS))"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{len(DEFAULTS)}\n", "")


def test_the_worker_loss_policy_is_fail_or_recover():
    with override_settings(SCHEDULING_WORKER_LOST_POLICY="retry"):
        with pytest.raises(ValueError, match="must be 'fail' or 'recover', not 'retry'"):
            conf.worker_lost_policy
