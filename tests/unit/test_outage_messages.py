"""The replica's one outage line names the error that started the outage (exceptions.describe)."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from scheduling.exceptions import describe

COMMIT = "consuming input failed:\n  could not receive data from server: Connection timed out"


def _raised(outer: str, inner: str | None) -> OperationalError:
    """The error Django's atomic raises when its reconnect (``finally``) fails after ``inner``."""
    with pytest.raises(OperationalError) as caught:
        try:
            if inner is not None:
                raise OperationalError(inner)
        finally:
            raise OperationalError(outer)  # what Django's atomic.__exit__ does
    return caught.value


def test_a_failed_reconnect_names_the_commit_error_it_replaced():
    assert describe(_raised("connection timeout expired", COMMIT)) == (
        "connection timeout expired (after: consuming input failed: could not receive data from"
        " server: Connection timed out)"
    )


def test_a_lone_error_is_its_message_on_one_line():
    assert describe(_raised("server closed\n the connection", None)) == (
        "server closed the connection"
    )


def test_the_same_message_twice_is_said_once():
    assert describe(_raised("the connection is lost", "the connection is lost")) == (
        "the connection is lost"
    )
