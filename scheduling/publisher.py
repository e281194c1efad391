"""Publish runs' Celery messages as Celery beat would, the work that is the same for every run
of a task definition done once.

Beat sends a registered task with its ``apply_async``, which merges the task's execution options
and calls ``Celery.send_task``; that builds every message from nothing: the route, the
``argsrepr``/``kwargsrepr``, a dozen settings read. It was a third of a replica's CPU in a burst,
more than the claim's own SQL (issue 17's profile). A replica sends the same periodic task's
message every slot with only the run's ids and headers changed. ``RunPublisher`` keeps what
``apply_async`` computes for a task definition (a ``_Template``, built by Celery's own
``amqp.create_task_message`` and ``amqp.router``) and sends each run through Celery's own
``amqp.send_task_message``: its serializer, compression, retry policy and
``before_task_publish``/``after_task_publish`` signals, so tracing that injects headers there
still sees every message. A task name this app does not know goes through ``send_task``, as
beat sends it. What reaches the broker is what beat would have sent
(``tests/integration/test_publisher.py`` compares the two).

No SQL here.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from amqp.exceptions import MessageNacked
from celery.app.amqp import task_message
from celery.utils.time import maybe_make_aware
from kombu import Queue
from kombu.exceptions import OperationalError as KombuOperationalError

from scheduling.exceptions import PublishFailed, RunRejected
from scheduling.run_message import Message

#: One immediate retry of a publish (a stale pooled connection reconnects); each attempt is
#: bounded by cadences.BROKER_TIMEOUT, so a dead broker fails the publish in seconds.
PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0,
                        "interval_max": 0}
#: Templates a replica keeps: one per periodic task definition it published (about 3 KB each);
#: past this many the cache starts again empty. A template costs about one ``send_task`` to
#: build, so tasks run too seldom to be found in the cache cost no more than before.
TEMPLATES_KEPT = 5_000
#: ``Message.options`` that differ from run to run of one task definition.
_PER_RUN = ("task_id", "headers", "expires")


@dataclass(frozen=True)
class _Template:
    """What ``Task.apply_async`` computes for one task definition, whatever the run.

    ``route`` holds the options it routes (the task's execution options under the periodic
    task's own); ``options`` the routed result, handed to ``send_task_message``, or None when
    ``task_routes`` are configured: a router may answer differently each time, so those are
    routed per run, as ``send_task`` does. ``message`` is Celery's protocol 2 message for a
    placeholder task id and no expiry; None under ``task_protocol`` 1, whose body holds the id:
    then every run's message is built by ``create_task_message``.
    """

    route: dict[str, Any]
    options: dict[str, Any] | None
    message: Any
    create: dict[str, Any]
    expires: Any
    ignore_result: bool


class RunPublisher:
    """Send runs' messages on a producer: ``publish(producer, message, ...)``.

    One per replica; it keeps a ``_Template`` per task definition (``Message.definition``) and each
    queue bound to the producer's channel. Built with the Celery ``app`` the replica runs.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._templates: dict[Hashable, _Template] = {}
        self._bound: dict[int, tuple[Queue, Queue]] = {}  # id of Celery's queue: (it, bound copy)

    def forget_channel(self) -> None:
        """Drop the queues bound to the old channel (the broker connection was reset)."""
        self._bound.clear()

    def publish(
        self, producer: Any, message: Message, *, reject_unknown: bool, timeout: float,
        buffered: bool = False,
    ) -> None:
        """Send one run's message; return once the broker has it (its confirm, on AMQP).

        ``reject_unknown`` and ``timeout`` (seconds) are ``SCHEDULING_REJECT_UNKNOWN_TASKS`` and
        ``cadences.BROKER_TIMEOUT``. ``buffered``: the producer is in a ``Producer.batch()`` of a
        transport that buffers (kombu's ``supports_batch_publish``), so the message is only added
        to the batch, which its flush sends (without kombu's retry). Then, once the queue's
        declaration is in the connection's cache (``Connection.declared_entities``), kombu's
        per-message retry wrapper and declaration check are skipped: they cost a tenth of a
        replica's publishing CPU in a herd and do no I/O there.

        Raises RunRejected for an unknown task name, PublishFailed when the broker refused the
        message (``basic.nack``: a full queue with ``reject-publish``, say), and lets the other
        broker errors (a channel error such as a missing exchange, a lost connection, a confirm
        not received within the timeout) propagate as kombu's errors: the claim rolls back.
        "Return once the broker has it" means, when ``buffered``, once the batch is flushed.
        """
        app = self.app
        task_type = app.tasks.get(message.name)
        if task_type is None:
            if reject_unknown:
                raise RunRejected(
                    f"unknown task name {message.name!r}: not registered in this app"
                )
            with _refusal():  # beat sends a name it does not know with send_task: so do we
                app.send_task(
                    message.name, args=message.args, kwargs=message.kwargs, producer=producer,
                    retry=True, retry_policy=PUBLISH_RETRY_POLICY, confirm_timeout=timeout,
                    **message.options,
                )
            return
        template = self._templates.get(message.definition)
        if template is None:  # never found for a message without a definition: none is kept
            template = self._template(message, task_type)
        task_id = message.options["task_id"]
        expires = message.options.get("expires", template.expires)
        options = template.options
        if options is None:
            options = app.amqp.router.route(
                {**template.route, "headers": message.options["headers"]},
                message.name, message.args, message.kwargs, task_type,
            )
        if expires is None and template.message is not None:
            sent = _instantiate(template.message, task_id, message)
        else:
            sent, options = self._build(template, message, task_id, expires, options)
        options = self._bind(options, producer.channel)
        declared = buffered and "declare" not in options and _declared(options, producer)
        with _refusal(), producer.connection._reraise_as_library_errors():
            if not template.ignore_result:
                app.backend.on_task_call(producer, task_id)
            app.amqp.send_task_message(
                producer, message.name, sent,
                retry=not declared, retry_policy=PUBLISH_RETRY_POLICY, confirm_timeout=timeout,
                **{**options, "headers": message.options["headers"]},
                **({"declare": []} if declared else {}),
            )

    def _template(self, message: Message, task_type: Any) -> _Template:
        """Compute what one run of ``message``'s task definition shares with every other, as
        Celery beat's ``apply_async`` of the registered ``task_type`` (``Task.apply_async``,
        Celery 5.5 to 5.7) computes it, and keep it."""
        app = self.app
        # Task.apply_async: the task's execution options under the run's own.
        options = {**task_type._get_exec_options()}
        options.update((k, v) for k, v in message.options.items() if k not in _PER_RUN)
        options.setdefault("ignore_result", task_type.ignore_result)
        shadow = None
        if not task_type.__v2_compat__:
            shadow = task_type.shadow_name(message.args, message.kwargs, options)
        expires = options.pop("expires", None)  # the task type's; a run's own comes first
        create = {
            "shadow": shadow,
            "time_limit": options.pop("time_limit", None),
            "soft_time_limit": options.pop("soft_time_limit", None),
            "ignore_result": options.pop("ignore_result"),
        }
        routed = None
        if not app.amqp.router.routes:
            routed = app.amqp.router.route(
                dict(options), message.name, message.args, message.kwargs, task_type
            )
        built = None
        if app.conf.task_protocol == 2:
            built = self._create(message, "-", None, create, routed or options)
        template = _Template(
            route=options, options=routed, message=built, create=create,
            expires=expires, ignore_result=bool(create["ignore_result"]),
        )
        if message.definition is not None:
            if len(self._templates) >= TEMPLATES_KEPT:
                self._templates.clear()
            self._templates[message.definition] = template
        return template

    def _create(
        self, message: Message, task_id: str, expires: Any, create: dict[str, Any],
        options: dict[str, Any],
    ) -> Any:
        """Celery's protocol message for one run, built as ``send_task`` builds it."""
        app = self.app
        return app.amqp.create_task_message(
            task_id, message.name, message.args, message.kwargs, None, None, None, None,
            expires, 0, None, None, None, app.thread_oid, create["time_limit"],
            create["soft_time_limit"], app.conf.task_send_sent_event, None, None,
            create["shadow"], None, ignore_result=create["ignore_result"], replaced_task_nesting=0,
            **{k: v for k, v in options.items() if k != "headers"},
        )

    def _build(
        self, template: _Template, message: Message, task_id: str, expires: Any,
        options: dict[str, Any],
    ) -> tuple[Any, dict[str, Any]]:
        """A run's message built whole (an expiry, or protocol 1), and its options with the
        ``expiration`` property ``send_task`` adds for an expiry (seconds from now, at least 0)."""
        if expires is not None:
            seconds = expires
            if isinstance(expires, datetime):
                seconds = (maybe_make_aware(expires) - self.app.now()).total_seconds()
            options = {**options, "expiration": max(seconds, 0)}
        return self._create(message, task_id, expires, template.create, options), options

    def _bind(self, options: dict[str, Any], channel: Any) -> dict[str, Any]:
        """``options`` with its queue bound to ``channel`` once, not copied at every publish.

        Celery hands kombu the queue it routed to, unbound; kombu binds a copy to the channel at
        each publish before it checks its declaration cache: a tenth of a replica's CPU in a
        burst (issue 17's profile). The bound copy is the same queue, declared the same way.
        """
        queue = options.get("queue")
        if not isinstance(queue, Queue) or queue.is_bound:
            return options
        kept = self._bound.get(id(queue))
        if kept is None or kept[0] is not queue or kept[1].channel is not channel:
            kept = self._bound[id(queue)] = (queue, queue.bind(channel))
        return {**options, "queue": kept[1]}


def _declared(options: dict[str, Any], producer: Any) -> bool:
    """Whether the queue ``options`` route to is in the declaration cache of ``producer``'s
    connection, as kombu's ``maybe_declare`` keeps it (by the entity's hash)."""
    queue = options.get("queue")
    if not isinstance(queue, Queue) or not queue.can_cache_declaration:
        return False
    return hash(queue) in producer.connection.declared_entities


@contextmanager
def _refusal() -> Iterator[None]:
    """Raise PublishFailed for a publish the broker refused (``basic.nack``: a full queue with
    ``reject-publish``, say), which kombu raises as an OperationalError with an empty message."""
    try:
        yield
    except KombuOperationalError as exc:
        if isinstance(exc.__cause__, MessageNacked):
            raise PublishFailed("the broker refused the message (basic.nack)") from exc
        raise


def _instantiate(template: Any, task_id: str, message: Message) -> Any:
    """A copy of a protocol 2 template message for the run with ``task_id``: its id, root id
    and correlation id; Celery's ``send_task_message`` adds ``message``'s headers itself."""
    headers, properties, body, sent_event = template
    headers = {**headers, "id": task_id, "root_id": task_id}
    properties = {**properties, "correlation_id": task_id}
    body = (message.args or (), message.kwargs or {}, dict(body[2]))
    if sent_event is not None:
        sent_event = {**sent_event, "uuid": task_id, "root_id": task_id}
    return task_message(headers, properties, body, sent_event)
