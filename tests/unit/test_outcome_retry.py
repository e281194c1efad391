"""A worker's outcome write through a database outage (a restart, a failover): ``worker.record``.

No database: the write is a stand-in that fails as Django does when the server is away.
"""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError

from scheduling import database_reach, worker


@pytest.fixture(autouse=True)
def fresh_reach(monkeypatch):
    monkeypatch.setattr(worker, "database", database_reach.DatabaseReach())
    monkeypatch.setattr(worker, "retry_delay", lambda failures, cap: 0.01)


def failing(times: int):
    calls = []

    def record_finished(task_id: str) -> bool:
        calls.append(task_id)
        if len(calls) <= times:
            raise OperationalError("connection failed: server closed the connection")
        return True

    return record_finished, calls


def lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_an_outcome_is_retried_until_the_database_is_back_and_the_outage_logged_once(caplog):
    write, calls = failing(times=5)
    with caplog.at_level(logging.DEBUG, logger="scheduling"):
        assert worker.record(write, "run-1") is True
    assert calls == ["run-1"] * 6
    # the first failure is retried at once and says nothing (a connection the server ended)
    (lost,) = lines(caplog, logging.ERROR)
    assert "lost the database (connected to no server yet)" in lost
    (back,) = lines(caplog, logging.WARNING)
    assert "reached the database again at ? after " in back


def test_a_dropped_connection_retried_at_once_logs_nothing():
    write, calls = failing(times=1)
    assert worker.record(write, "run-2") is True
    assert calls == ["run-2", "run-2"]


def test_an_outcome_is_given_up_after_its_patience_with_one_error(caplog):
    write, calls = failing(times=10_000)
    with caplog.at_level(logging.INFO, logger="scheduling"):
        assert worker.record(write, "run-3", patience=0.2) is False
    assert 5 <= len(calls) <= 25  # 0.01 s apart for 0.2 s
    errors = lines(caplog, logging.ERROR)
    assert len(errors) == 2, errors
    assert "lost the database" in errors[0]
    assert errors[1] == "cannot record record_finished for run run-3"
