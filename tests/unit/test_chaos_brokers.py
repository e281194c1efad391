"""The chaos tool's broker faults touch only the chaos run's broker (``tools.brokers``): no broker.

A flush only ever hits the database the URL names; a RabbitMQ connection cut only a vhost the
caller says is the run's own; a connection cut finds the victim's own TCP connections.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from tools.brokers import Broker, amqp_vhost, connections_to, process_group, redis_db

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.parametrize(
    ("url", "db"),
    [
        ("redis://127.0.0.1:6379/8", 8),
        ("redis://:secret@127.0.0.1:6379/0", 0),
        ("redis://127.0.0.1:6379?db=3", 3),
        ("redis://127.0.0.1:6379", None),  # DB 0 by default, but not named: never flushed
        ("redis://127.0.0.1:6379/", None),
    ],
)
def test_the_database_a_redis_url_names(url, db):
    assert redis_db(url) == db
    assert ("flush" in Broker(url, "q").kinds) is (db is not None)


def test_a_flush_refuses_a_url_that_names_no_database():
    with pytest.raises(ValueError, match="naming its database"):
        Broker("redis://127.0.0.1:6379", "q").flush()
    with pytest.raises(ValueError):
        Broker("amqp://guest@127.0.0.1:5672//", "q").flush()


def test_rabbitmq_connections_are_cut_only_on_a_vhost_of_the_runs_own(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}")
    assert amqp_vhost("amqp://guest@127.0.0.1:5672//") == "/"
    assert amqp_vhost("amqp://guest@127.0.0.1:5672") == "/"
    assert amqp_vhost("amqp://guest@127.0.0.1:5672/chaos%2Fone") == "chaos/one"
    assert Broker("amqp://guest@h:5672//", "q", own_vhost=True).kinds == ["purge"]
    assert Broker("amqp://guest@h:5672/chaos", "q").kinds == ["purge"]
    assert Broker("amqp://guest@h:5672/chaos", "q", own_vhost=True).kinds == ["purge", "cut"]
    assert Broker("sqlpoll+postgresql+psycopg://h/db", "q").kinds == ["purge", "cut"]


@linux
def test_a_cut_finds_the_victims_own_connections():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    try:
        me = os.getpid()
        assert me in process_group(os.getpgid(0))
        assert connections_to({me}, port) == [client.getsockname()]
        assert connections_to({me}, port + 1 if port < 65535 else port - 1) == []
        assert connections_to({2**22 + 7}, port) == []  # no such process
    finally:
        for sock in (client, accepted, server):
            sock.close()
