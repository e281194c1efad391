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

from scheduling import cadences
from scheduling.conf import DEFAULTS, INTERNAL, conf


@pytest.fixture(autouse=True)
def _no_environment_fallbacks(monkeypatch):
    monkeypatch.delenv("SCHEDULING_REPLICA_ID", raising=False)
    monkeypatch.delenv("SCHEDULING_METRICS_PORT", raising=False)


def test_every_setting_is_read_through_override_settings_and_converted():
    configured = {
        "REPLICA_ID": 7, "PREPARED_CLAIM": 0, "DIRECT_DATABASE": "direct",
        "MISFIRE_GRACE_SECONDS": 30, "OVERLAP_STALE_SECONDS": "120", "WORKER_LOST_AFTER": 10,
        "WORKER_LOST_POLICY": "recover", "DELIVERY_TIMEOUT": "30", "REPUBLISH_LIMIT": "2",
        "REJECT_UNKNOWN_TASKS": "", "METRICS_PORT": "9100", "METRICS_ADDR": "127.0.0.1",
        "METRICS_TASK_LABELS": 0, "PRUNE_OLDER_THAN": "12h", "PRUNE_KEEP_LAST": "3",
        "SUCCESS_DEADLINE": "90", "WEBHOOK_URL": "http://127.0.0.1:1/hook", "WEBHOOK_TIMEOUT": 2,
        "WEBHOOK_RETRIES": "1",
    }
    assert set(configured) == set(DEFAULTS)
    with override_settings(**{f"SCHEDULING_{name}": value for name, value in configured.items()}):
        read = {name: getattr(conf, name.lower()) for name in DEFAULTS}
    assert {name: (type(value), value) for name, value in read.items()} == {
        "REPLICA_ID": (str, "7"), "PREPARED_CLAIM": (bool, False),
        "DIRECT_DATABASE": (str, "direct"), "MISFIRE_GRACE_SECONDS": (float, 30.0),
        "OVERLAP_STALE_SECONDS": (float, 120.0), "WORKER_LOST_AFTER": (float, 10.0),
        "WORKER_LOST_POLICY": (str, "recover"), "DELIVERY_TIMEOUT": (float, 30.0),
        "REPUBLISH_LIMIT": (int, 2), "REJECT_UNKNOWN_TASKS": (bool, False),
        "METRICS_PORT": (int, 9100), "METRICS_ADDR": (str, "127.0.0.1"),
        "METRICS_TASK_LABELS": (bool, False),
        "PRUNE_OLDER_THAN": (timedelta, timedelta(hours=12)), "PRUNE_KEEP_LAST": (int, 3),
        "SUCCESS_DEADLINE": (float, 90.0), "WEBHOOK_URL": (str, "http://127.0.0.1:1/hook"),
        "WEBHOOK_TIMEOUT": (float, 2.0), "WEBHOOK_RETRIES": (int, 1),
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


def test_the_internal_cadences_are_constants_not_settings():
    """The removed settings that became internal are module constants of scheduling.cadences,
    with the values they had as settings, and none is a setting any more."""
    assert {name: getattr(cadences, name) for name in INTERNAL} == {
        "MAX_INTERVAL": 0.5, "BATCH_SIZE": 100, "RECONCILE_INTERVAL": 60.0,
        "FULL_RECONCILE_INTERVAL": 3600.0, "STATEMENT_TIMEOUT": 5.0,
        "IDLE_IN_TRANSACTION_TIMEOUT": 10.0, "TCP_KEEPALIVES_IDLE": 5, "RETRY_BACKOFF_MAX": 3.0,
        "BROKER_TIMEOUT": 2.0, "HEARTBEAT_INTERVAL": 5.0, "PRUNE_INTERVAL": 3600.0,
        "PRUNE_BATCH_SIZE": 500, "OVERDUE_INTERVAL": 1.0,
    }
    assert set(INTERNAL) & set(DEFAULTS) == set()
    constants = {name for name in vars(cadences) if name.isupper()}
    # HERD_BATCH_SIZE came with the herd's growing claims: never a setting of a release.
    assert constants == {*INTERNAL, "HERD_BATCH_SIZE"}
    assert cadences.HERD_BATCH_SIZE == 400

