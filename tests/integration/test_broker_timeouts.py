"""The scheduler's broker connection fails fast when the broker freezes: no claim waits on it."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from unittest.mock import patch

import pytest
from celery import Celery
from django.conf import settings
from django.test import override_settings

from scheduling import cadences, ledger
from scheduling.models import Run
from scheduling.schedulers import LedgerScheduler
from tests.acceptance.deployment import broker_is_amqp, broker_is_redis, delete_queue
from tests.conftest import kombu_batches_publishes
from tests.integration.conftest import make_due
from tests.tcp_proxy import TcpProxy, proxied_broker_url

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

TIMEOUT = 1.0


@pytest.fixture
def proxied_app(monkeypatch):
    """A Celery app whose broker URL goes through a TcpProxy; yields (app, proxy)."""
    template, upstream = proxied_broker_url(settings.CELERY_BROKER_URL)
    proxy = TcpProxy(upstream)
    url = template.format(port=proxy.port)
    monkeypatch.setenv("CELERY_BROKER_URL", url)  # Celery prefers it to the app's own
    app = Celery("proxied", broker=url, set_as_current=False)
    app.conf.task_default_queue = f"q-{uuid.uuid4().hex[:10]}"
    try:
        yield app, proxy
    finally:
        proxy.close()
        delete_queue(app.conf.task_default_queue)


@pytest.mark.skipif(
    not (broker_is_redis() or broker_is_amqp()),
    reason="kombu's SQL transport has no socket read timeout (psycopg has none): a frozen "
    "SQL broker holds the publish until the claim's idle-in-transaction bound",
)
@override_settings(SCHEDULING_REJECT_UNKNOWN_TASKS=False)
@patch.multiple(cadences, BROKER_TIMEOUT=TIMEOUT)
def test_a_publish_to_a_frozen_broker_fails_within_the_broker_timeout(proxied_app, make_task):
    app, proxy = proxied_app
    start = ledger.database_now() - timedelta(seconds=0.5)
    first = make_task(every=3600, start_time=start)
    scheduler = LedgerScheduler(app=app)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("scheduling.schedulers").addHandler(handler)
    try:
        for _ in range(3):
            scheduler.tick()
        assert Run.objects.get(periodic_task=first, scheduled_for=start).status == "dispatched"
        assert proxy.connections >= 1  # the publish went through the proxy

        second = make_task(every=3600)
        run = make_due(second)
        proxy.freeze()
        began = time.monotonic()
        delay = scheduler.tick()
        elapsed = time.monotonic() - began
        run.refresh_from_db()
        assert run.status == Run.Status.PENDING
        assert 0 < delay
        proxy.thaw()
    finally:
        logging.getLogger("scheduling.schedulers").removeHandler(handler)
    print(f"frozen publish failed after {elapsed:.2f} s")
    assert elapsed < 4 * TIMEOUT + 1.0
    [line] = [r for r in records if "unavailable" in r]
    # The product's words exactly; the client library's part of the message only as far as it
    # names the timeout (kombu 5.7 words a failed pipeline itself, older kombu does not batch;
    # redis-py names the socket or, from 8.x on, its address: "Timeout reading from host:port").
    if broker_is_redis():
        runs = "runs" if kombu_batches_publishes() else "run"  # one pipeline per claim on 5.7
        prefix, cause = f"cannot publish {runs} {run.task_id}: ", "Timeout reading from "
    else:  # the write went out; the broker's confirm did not come back
        prefix, cause = f"cannot publish run {run.task_id}: ", "timed out"
    assert line.startswith(f"broker unavailable, retrying with backoff: {prefix}")
    assert cause in line
