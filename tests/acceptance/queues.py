"""What a broker holds in one deployment's queue: count the waiting messages, or purge them.

For the delivery tests (invariant 9): a purge is a message lost inside the broker, and the count
shows how many copies of each run a long queue collects. Only the named queue is touched (each
deployment has its own), never the rest of the broker: on Redis the queue's list keys (kombu keeps
one per priority step), on kombu's SQL transport the queue's rows, on RabbitMQ ``queue.purge``.
"""

from __future__ import annotations

from django.conf import settings

#: kombu's Redis transport: a queue's messages of priority p > 0 are in the list "<queue>\x06\x16p".
_REDIS_PRIORITY_SEPARATOR = "\x06\x16"
_REDIS_PRIORITY_STEPS = (0, 3, 6, 9)


def waiting(queue: str) -> int:
    """Return how many messages wait in ``queue`` (not delivered to a consumer).

    Redis: the lengths of the queue's lists (LLEN). SQL transport: its visible rows (a delivered
    row is kept, invisible, until its acknowledgement). RabbitMQ: ``queue.declare`` passive's
    ``message_count`` (0 if the queue was never declared).
    """
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis://", "rediss://")):
        client = _redis(url)
        return sum(client.llen(key) for key in _redis_keys(queue))
    if url.startswith("sqlpoll+"):
        return _sql(url, _SQL_WAITING, queue)
    if url.startswith(("amqp://", "pyamqp://")):
        from amqp.exceptions import NotFound
        from kombu import Connection

        with Connection(url, connect_timeout=5) as broker:
            try:
                return broker.channel().queue_declare(queue, passive=True).message_count
            except NotFound:
                return 0
    raise NotImplementedError(f"cannot count the messages of broker {url.split(':', 1)[0]}")


def worker_holds(concurrency: int, prefetch_multiplier: int) -> int:
    """Return how many messages of its queue an idle prefork worker takes when many wait.

    On Redis and RabbitMQ the worker consumes in its event loop and reserves up to its prefetch
    count, ``concurrency`` x ``prefetch_multiplier``. kombu's SQL transport polls: Celery's
    consumer then runs without an event loop and, with ``worker_pool_putlocks`` (on by default),
    waits for a free pool process before it takes the next message, so it holds one message
    beyond those executing, whatever the prefetch count.
    """
    if settings.CELERY_BROKER_URL.startswith("sqlpoll+"):
        return concurrency + 1
    return concurrency * prefetch_multiplier


def purge(queue: str) -> int:
    """Delete every message of ``queue`` from the broker, as a broker restart without persistence
    or an operator's purge would; return how many were waiting (before the purge)."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis://", "rediss://")):
        client = _redis(url)
        keys = _redis_keys(queue)
        with client.pipeline(transaction=True) as pipeline:
            for key in keys:
                pipeline.llen(key)
            pipeline.delete(*keys)
            *lengths, _ = pipeline.execute()
        return sum(lengths)
    if url.startswith("sqlpoll+"):
        return _sql(url, _SQL_PURGE, queue)
    if url.startswith(("amqp://", "pyamqp://")):
        from kombu import Connection

        with Connection(url, connect_timeout=5) as broker:
            return broker.channel().queue_purge(queue) or 0
    raise NotImplementedError(f"cannot purge broker {url.split(':', 1)[0]}")


def _redis(url: str):
    import redis

    return redis.Redis.from_url(url)


def _redis_keys(queue: str) -> list[str]:
    return [
        queue if step == 0 else f"{queue}{_REDIS_PRIORITY_SEPARATOR}{step}"
        for step in _REDIS_PRIORITY_STEPS
    ]


_SQL_WAITING = (
    "SELECT count(*) FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id"
    " WHERE q.name = %s AND m.visible"
)
_SQL_PURGE = (
    "WITH deleted AS (DELETE FROM kombu_message m USING kombu_queue q"
    " WHERE q.id = m.queue_id AND q.name = %s AND m.visible RETURNING 1)"
    " SELECT count(*) FROM deleted"
)


def _sql(url: str, statement: str, queue: str) -> int:
    """Run ``statement`` (a count, or a delete that counts) on kombu's tables for ``queue``."""
    import psycopg

    dsn = url.removeprefix("sqlpoll+").replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn) as conn:
        return conn.execute(statement, [queue]).fetchone()[0]
