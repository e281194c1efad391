"""Invariant 8: the scheduler's session carries the server-side bounds, named by its replica."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from django.db import connection
from django.test import override_settings

from scheduling import cadences, ledger

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(SCHEDULING_REPLICA_ID="replica-7")
@patch.multiple(
    cadences, IDLE_IN_TRANSACTION_TIMEOUT=3.5, STATEMENT_TIMEOUT=2.0, TCP_KEEPALIVES_IDLE=9
)
def test_configure_session_sets_timeouts_keepalives_and_application_name():
    connection.close()
    ledger.configure_session()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('idle_in_transaction_session_timeout'),"
            " current_setting('statement_timeout'), current_setting('tcp_keepalives_idle'),"
            " current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'),"
            " current_setting('tcp_user_timeout'), current_setting('application_name')"
        )
        values = cursor.fetchone()
        # Over a Unix socket (the embedded server) the keepalive settings read back as 0.
        unix = connection.get_connection_params().get("host", "").startswith("/")
    assert values[:2] == ("3500ms", "2s")
    # 9 s idle, 3 probes 4 s apart: the server gives up on a silent replica after 21 s, with or
    # without data in flight (tcp_user_timeout).
    assert values[2:6] == (("0", "0", "0", "0") if unix else ("9", "4", "3", "21000"))  # milliseconds
    assert values[6] == "scheduling-beat:replica-7"
    params = connection.get_connection_params()  # client side: the example settings
    assert {k: params[k] for k in ("keepalives_idle", "tcp_user_timeout", "connect_timeout")} == {
        "keepalives_idle": 5, "tcp_user_timeout": 11_000, "connect_timeout": 10,
    }



def test_application_name_is_cut_to_what_postgresql_keeps():
    assert ledger.application_name("r" * 100) == "scheduling-beat:" + "r" * 47
    assert len(ledger.application_name("é" * 40).encode()) <= 63
