"""The optional webhook: one JSON document per run outcome and per overdue run, POSTed to a URL.

Set ``SCHEDULING_WEBHOOK_URL`` and every process of the app (beat replicas, workers) connects
``receive`` to ``signals.run_finished`` and ``signals.run_overdue`` at start. Each event is handed
to a background thread of the process (never posted inside a claim transaction, nor in the tick
or the task's path), which POSTs it as ``application/json`` with ``SCHEDULING_WEBHOOK_TIMEOUT``
seconds per attempt, and tries again after no answer, a 5xx or a 429 at most
``SCHEDULING_WEBHOOK_RETRIES`` times, waiting 0.5 s, 1 s, 2 s, ... in between; any other status,
or the last failure, is logged and the event dropped. Delivery is at most once per attempt
sequence: a POST that reached the server but whose answer was lost is sent again, so receivers
should drop repeats by ``event_id``; events still queued when a process exits are lost.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from scheduling import signals
from scheduling.conf import conf

logger = logging.getLogger(__name__)

#: Most events waiting for the background thread; past it new events are logged and dropped.
QUEUE_LIMIT = 1000
#: Wait before the first retry, seconds; doubled for each next one.
FIRST_BACKOFF = 0.5


def post(url: str, document: dict[str, Any], timeout: float, retries: int) -> bool:
    """POST ``document`` as JSON to ``url``; return whether a 2xx answer came.

    ``timeout`` is seconds per attempt (connect and read); after no answer, a 5xx or a 429 it
    tries again at most ``retries`` times, waiting ``FIRST_BACKOFF`` seconds and doubling. Never
    raises: the last failure is logged at error.
    """
    body = json.dumps(document).encode()
    failure = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(FIRST_BACKOFF * 2 ** (attempt - 1))
        request = urllib.request.Request(
            url, data=body, method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "scheduling-webhook"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
                return True
        except urllib.error.HTTPError as exc:
            failure = f"HTTP {exc.code}"
            if exc.code < 500 and exc.code != 429:
                break  # the server refused the document: sending it again changes nothing
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failure = str(getattr(exc, "reason", exc))
    logger.error(
        "webhook %s of %s failed after %d attempts: %s", document.get("event"),
        document.get("event_id"), attempt + 1, failure, extra={"action": "webhook_failed"},
    )
    return False


class Sender:
    """The per-process background thread that posts queued events in order (``post``).

    Started on the first event in each process (so a forked worker child gets its own); a daemon
    thread, so it never keeps a process alive.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(QUEUE_LIMIT)
        self._lock = threading.Lock()

    def enqueue(self, url: str, document: dict[str, Any]) -> None:
        """Queue ``document`` for ``url``; never blocks (a full queue drops it, logged)."""
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: a thread of its own
                self._pid = os.getpid()
                self._queue = queue.Queue(QUEUE_LIMIT)
                threading.Thread(target=self._run, name="scheduling-webhook", daemon=True).start()
        try:
            self._queue.put_nowait((url, document))
        except queue.Full:
            logger.error(
                "webhook queue full (%d events): %s dropped", QUEUE_LIMIT,
                document.get("event_id"), extra={"action": "webhook_failed"},
            )

    def wait_idle(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until every queued event was handled; return whether."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _run(self) -> None:
        jobs = self._queue
        while True:
            url, document = jobs.get()
            try:
                post(url, document, conf.webhook_timeout, conf.webhook_retries)
            except Exception:  # noqa: BLE001 - the thread must outlive any one event
                logger.exception("webhook thread error", extra={"action": "webhook_failed"})
            finally:
                jobs.task_done()


#: The process's sender (``receive`` queues on it).
outbox = Sender()


def receive(sender: Any = None, event: dict[str, Any] | None = None, **_: Any) -> None:
    """Signal receiver: queue ``event`` for ``SCHEDULING_WEBHOOK_URL`` (nothing when unset)."""
    url = conf.webhook_url
    if url and event is not None:
        outbox.enqueue(url, event)


def connect() -> None:
    """Connect ``receive`` to both signals (idempotent); done at start when the URL is set."""
    signals.run_finished.connect(receive, dispatch_uid="scheduling.webhook.finished")
    signals.run_overdue.connect(receive, dispatch_uid="scheduling.webhook.overdue")


def disconnect() -> None:
    """Undo ``connect``."""
    signals.run_finished.disconnect(dispatch_uid="scheduling.webhook.finished")
    signals.run_overdue.disconnect(dispatch_uid="scheduling.webhook.overdue")
