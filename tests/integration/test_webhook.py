"""The webhook's POST against a real local HTTP server: retries bounded, timeouts kept."""

from __future__ import annotations

import time

import pytest

from scheduling import webhook
from tests.webhook_server import Hook

DOCUMENT = {"event": "run.overdue", "event_id": "run.overdue:t-1", "run_id": 1}


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(webhook, "FIRST_BACKOFF", 0.05)


def test_a_document_is_posted_once_as_json():
    hook = Hook()
    try:
        assert webhook.post(hook.url, DOCUMENT, timeout=5, retries=3) is True
    finally:
        hook.close()
    assert (hook.requests, hook.documents, hook.content_types) == (
        1, [DOCUMENT], ["application/json"]
    )


def test_server_errors_are_retried_a_bounded_number_of_times(fast_backoff):
    hook = Hook(answers=[500, 503, 429])
    try:
        assert webhook.post(hook.url, DOCUMENT, timeout=5, retries=3) is True
    finally:
        hook.close()
    assert (hook.requests, hook.documents) == (4, [DOCUMENT])

    hook = Hook(answers=[500] * 10)
    try:
        assert webhook.post(hook.url, DOCUMENT, timeout=5, retries=2) is False
    finally:
        hook.close()
    assert (hook.requests, hook.documents) == (3, [])  # the first try and 2 retries


def test_a_refusal_is_not_retried(fast_backoff):
    hook = Hook(answers=[400, 200])
    try:
        assert webhook.post(hook.url, DOCUMENT, timeout=5, retries=3) is False
    finally:
        hook.close()
    assert (hook.requests, hook.documents) == (1, [])


def test_a_slow_server_is_given_up_on_after_the_timeout(fast_backoff):
    hook = Hook(delay=3.0)
    try:
        started = time.monotonic()
        assert webhook.post(hook.url, DOCUMENT, timeout=0.3, retries=1) is False
        elapsed = time.monotonic() - started
    finally:
        hook.close()
    assert hook.requests == 2
    assert elapsed < 2.5  # two attempts of 0.3 s and one wait, not the server's 3 s each


def test_the_background_sender_posts_in_order_without_blocking(fast_backoff):
    hook = Hook(delay=0.2)
    sender = webhook.Sender()
    try:
        started = time.monotonic()
        for n in range(3):
            sender.enqueue(hook.url, {**DOCUMENT, "run_id": n})
        assert time.monotonic() - started < 0.1  # the caller (a tick, a worker) never waits
        assert sender.wait_idle(10)
    finally:
        hook.close()
    assert [doc["run_id"] for doc in hook.documents] == [0, 1, 2]
