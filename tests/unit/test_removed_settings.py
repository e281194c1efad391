"""System check scheduling.W003: each removed or renamed SCHEDULING_* setting still set in the
Django settings gets a warning naming it, what took its place and what to do."""

from __future__ import annotations

import pytest
from django.test import override_settings

from scheduling import checks
from scheduling.checks import check_removed_settings
from scheduling.conf import DEFAULTS, REMOVED, RemovedSetting

HINT = "Remove {} from your settings (docs/configuration.md, Removed settings)."

#: Every removed setting and the exact warning it gets, written out.
MESSAGES = {
    "MAX_INTERVAL": "it is internal now (scheduling.cadences.MAX_INTERVAL = 0.5).",
    "BATCH_SIZE": "it is internal now (scheduling.cadences.BATCH_SIZE = 100).",
    "RECONCILE_INTERVAL": "it is internal now (scheduling.cadences.RECONCILE_INTERVAL = 60.0).",
    "FULL_RECONCILE_INTERVAL":
        "it is internal now (scheduling.cadences.FULL_RECONCILE_INTERVAL = 3600.0).",
    "STATEMENT_TIMEOUT": "it is internal now (scheduling.cadences.STATEMENT_TIMEOUT = 5.0).",
    "IDLE_IN_TRANSACTION_TIMEOUT":
        "it is internal now (scheduling.cadences.IDLE_IN_TRANSACTION_TIMEOUT = 10.0).",
    "TCP_KEEPALIVES_IDLE": "it is internal now (scheduling.cadences.TCP_KEEPALIVES_IDLE = 5).",
    "RETRY_BACKOFF_MAX": "it is internal now (scheduling.cadences.RETRY_BACKOFF_MAX = 3.0).",
    "BROKER_TIMEOUT": "it is internal now (scheduling.cadences.BROKER_TIMEOUT = 2.0).",
    "HEARTBEAT_INTERVAL": "it is internal now (scheduling.cadences.HEARTBEAT_INTERVAL = 5.0).",
    "PRUNE_INTERVAL": "it is internal now (scheduling.cadences.PRUNE_INTERVAL = 3600.0).",
    "PRUNE_BATCH_SIZE": "it is internal now (scheduling.cadences.PRUNE_BATCH_SIZE = 500).",
    "OVERDUE_INTERVAL": "it is internal now (scheduling.cadences.OVERDUE_INTERVAL = 1.0).",
    "TEST_PAUSE_AFTER_PUBLISH": "it was removed in 0.1.0, and nothing replaces it.",
}


def test_the_removed_settings_are_these_and_none_is_a_setting():
    assert [removed.name for removed in REMOVED] == list(MESSAGES)
    assert {removed.removed_in for removed in REMOVED} == {"0.1.0"}
    assert {removed.name for removed in REMOVED} & set(DEFAULTS) == set()


@pytest.mark.parametrize("name", MESSAGES)
def test_each_removed_setting_warns_with_what_took_its_place(name):
    with override_settings(**{f"SCHEDULING_{name}": 1}):
        found = [(m.id, m.obj, m.msg, m.hint) for m in check_removed_settings()]
    old = f"SCHEDULING_{name}"
    assert found == [(
        "scheduling.W003", old, f"{old} is no longer a setting and is ignored: {MESSAGES[name]}",
        HINT.format(old),
    )]


def test_one_warning_per_name_set_in_the_list_order_and_none_without():
    with override_settings(SCHEDULING_RECONCILE_INTERVAL=5, SCHEDULING_BATCH_SIZE=10):
        found = [m.obj for m in check_removed_settings()]
    assert found == ["SCHEDULING_BATCH_SIZE", "SCHEDULING_RECONCILE_INTERVAL"]
    assert check_removed_settings() == []


def test_a_renamed_setting_warns_with_its_new_name(monkeypatch):
    monkeypatch.setattr(checks, "REMOVED", (RemovedSetting("OLD_NAME", "NEW_NAME", "1.1.0"),))
    with override_settings(SCHEDULING_OLD_NAME=3):
        found = [(m.id, m.obj, m.msg, m.hint) for m in check_removed_settings()]
    assert found == [(
        "scheduling.W003", "SCHEDULING_OLD_NAME",
        ("SCHEDULING_OLD_NAME is no longer a setting and is ignored: it was renamed "
         "SCHEDULING_NEW_NAME in 1.1.0."),
        ("Rename SCHEDULING_OLD_NAME to SCHEDULING_NEW_NAME in your settings "
         "(docs/configuration.md, Removed settings)."),
    )]
