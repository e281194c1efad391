"""The Celery and kombu options a replica's producer publishes with: the Celery settings pinned
on the app, the broker timeouts and publisher confirms (``LedgerScheduler.connection``)."""

from __future__ import annotations

from typing import Any

#: The Celery settings ``send_task`` reads at every publish (Celery 5.7): a replica publishes
#: every run with it.
PUBLISH_SETTINGS = (
    "task_always_eager", "task_repr_maxlevels", "task_send_sent_event",
    "broker_pool_acquire_timeout", "task_default_queue", "task_protocol",
)


def pin_publish_settings(app: Any) -> None:
    """Write the current value of each of ``PUBLISH_SETTINGS`` into ``app``'s own configuration.

    With ``config_from_object("django.conf:settings", namespace="CELERY")``, as Celery's Django
    guide has it, a setting the project leaves at its default is looked up in Django's settings
    under each of its names, every miss an exception, before Celery's defaults are reached: six
    such reads a message were a fifth of a replica's CPU in a burst, profiled. The
    values stay what they were; Celery finds them first. Set them on the app, or in the settings
    before the replica starts. A name this Celery has no setting for is left out.
    """
    for name in PUBLISH_SETTINGS:
        try:
            value = app.conf[name]
        except KeyError:  # not a setting of this Celery (5.5 has neither of the two middle ones)
            continue
        app.conf[name] = value


def broker_timeout_options(driver_type: str, timeout: float) -> dict[str, Any]:
    """Return kombu transport options bounding connect and socket waits to ``timeout`` seconds.

    ``driver_type`` is the kombu transport's (``redis``, ``amqp``, ``sql``); other transports get
    no options. The SQL transport passes them to SQLAlchemy's ``create_engine``: libpq's
    ``connect_timeout`` (whole seconds, at least 2) and a ping before reusing a pooled connection.
    """
    if driver_type == "redis":
        return {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if driver_type == "amqp":
        return {"read_timeout": timeout, "write_timeout": timeout}
    if driver_type == "sql":
        return {"connect_args": {"connect_timeout": max(2, round(timeout))}, "pool_pre_ping": True}
    return {}


def publisher_confirm_options(driver_type: str) -> dict[str, Any]:
    """Return kombu transport options that make a publish wait for the broker's acceptance.

    On AMQP (``driver_type`` ``amqp``, py-amqp) ``confirm_publish`` puts every channel of the
    connection in confirm mode: ``basic.publish`` then waits for the broker's ``basic.ack``, and
    a ``basic.nack`` or a channel error raises instead of the message being dropped unseen. Each
    publish costs one round trip more. Redis and kombu's SQL transport need nothing: their
    publish returns after the server's reply (Redis's to the push, PostgreSQL's to the commit).
    """
    if driver_type == "amqp":
        return {"confirm_publish": True}
    return {}
