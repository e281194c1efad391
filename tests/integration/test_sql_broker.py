"""The serviceless broker (``project.broker``) redelivers what a dead consumer never acknowledged.

Found by the chaos run: stock kombu's SQL transport lost the messages a SIGKILLed worker had
received (prefetched runs stayed dispatched for ever), and a first fix that served waiting
messages before stale ones starved the redelivery under steady load.
"""

from __future__ import annotations

import threading
import time
import uuid
from queue import Empty

import pytest
from kombu import Connection
from kombu.transport.sqlalchemy import Channel as SQLChannel
from sqlalchemy import text

from project import embedded
from project.broker import Channel
from tests.acceptance.deployment import test_database_url as database_url
from tests.conftest import connect_raw

pytestmark = [pytest.mark.once, pytest.mark.django_db(transaction=True)]  # always the SQL broker


def _connection(timeout: float = 3600) -> Connection:
    url = embedded.sql_broker_url(database_url())
    return Connection(url, transport_options={"visibility_timeout": timeout})


@pytest.fixture(autouse=True)
def _dispose_engines():
    yield
    for engine, _ in SQLChannel._engines.values():  # kombu caches engines per URL
        engine.dispose()
    SQLChannel._engines.clear()


def _queue(name: str, timeout: float):
    conn = _connection(timeout)
    return conn, conn.SimpleQueue(name)


def test_unacknowledged_messages_are_redelivered_oldest_first_and_acked_ones_never():
    name = f"q-{uuid.uuid4().hex[:8]}"
    dead, dead_queue = _queue(name, 0.5)
    live, queue = _queue(name, 0.5)
    try:
        dead_queue.put({"n": 1})
        dead_queue.put({"n": 2})
        lost = dead_queue.get(block=False)  # received, then its consumer dies: never acked
        assert (lost.payload, lost.delivery_info.get("redelivered")) == ({"n": 1}, None)
        second = queue.get(block=False)
        assert second.payload == {"n": 2}
        second.ack()
        queue.put({"n": 3})  # waiting, while the lost one is past its visibility timeout
        time.sleep(0.6)
        again = queue.get(block=False)
        assert (again.payload, again.delivery_info.get("redelivered")) == ({"n": 1}, True)
        again.ack()
        third = queue.get(block=False)
        assert third.payload == {"n": 3}
        third.ack()
        time.sleep(0.6)
        with pytest.raises(Empty):
            queue.get(block=False)
    finally:
        for conn in (dead, live):
            conn.default_channel.session.close()
            conn.release()


def _declare(url: str, name: str, barrier, results) -> None:
    SQLChannel._engines.clear()  # a forked child must not share the parent's sockets
    conn = Connection(url)
    channel = conn.default_channel
    barrier.wait()
    try:
        results.put(channel._get_or_create(name).id)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(repr(exc))
    finally:
        channel.session.close()
        conn.release()


def _declared_at_once(count: int) -> list:
    """What ``count`` forked processes declaring one new queue at the same instant got: each
    one's queue row id, or the repr of what it raised."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    name, url = f"q-{uuid.uuid4().hex[:8]}", embedded.sql_broker_url(database_url())
    barrier, results = context.Barrier(count), context.Queue()
    for engine, _ in SQLChannel._engines.values():
        engine.dispose()
    SQLChannel._engines.clear()
    children = [
        context.Process(target=_declare, args=(url, name, barrier, results)) for _ in range(count)
    ]
    for child in children:
        child.start()
    found = [results.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=30)
    return found


def test_consumers_declaring_one_new_queue_at_once_all_get_it():
    """Found by the chaos run: two workers starting together, one died of a unique violation."""
    found = _declared_at_once(8)
    assert len(set(found)) == 1 and isinstance(found[0], int), found


def test_processes_opening_the_broker_on_a_new_database_at_once_all_get_its_tables():
    """Found in .ci/run: three replicas starting together on a fresh database, one's first
    publish failed on kombu's CREATE TABLE (DuplicateTable) and was retried a tick later."""
    with connect_raw() as admin:
        admin.execute("DROP TABLE IF EXISTS kombu_message, kombu_queue")
        admin.commit()
    found = _declared_at_once(6)
    assert len(set(found)) == 1 and isinstance(found[0], int), found


def test_a_poll_whose_session_is_cut_raises_a_connection_error_and_the_next_poll_delivers(
    monkeypatch,
):
    """Found by the chaos run under load: a worker's broker session cut in the middle of a poll
    killed the worker ("Unrecoverable error: PendingRollbackError"). kombu's poll commits in a
    ``finally``, and the commit on the broken session replaced the connection error Celery
    recovers from. The poll's message is not lost: it is delivered by the next poll."""
    conn, queue = _queue(f"q-{uuid.uuid4().hex[:8]}", 3600)
    try:
        queue.put({"n": 1})
        channel = conn.default_channel
        pid = channel.session.execute(text("SELECT pg_backend_pid()")).scalar()
        channel.session.commit()
        declared = Channel._get_or_create

        def cut_after_declaring(self, name):
            found = declared(self, name)
            with connect_raw() as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                admin.commit()
            monkeypatch.setattr(Channel, "_get_or_create", declared)  # once
            return found

        monkeypatch.setattr(Channel, "_get_or_create", cut_after_declaring)
        with pytest.raises(conn.connection_errors) as raised:
            queue.get(block=False)
        assert type(raised.value).__name__ == "OperationalError"
        message = queue.get(block=False)
        assert (message.payload, message.delivery_info.get("redelivered")) == ({"n": 1}, None)
        message.ack()
    finally:
        conn.default_channel.session.close()
        conn.release()
