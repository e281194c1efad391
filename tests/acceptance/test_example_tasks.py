"""The example project's digest task, on a real worker: the e-mail it sends (the console e-mail
backend prints it) is logged at INFO, not as a WARNING."""

from __future__ import annotations

import re

import pytest

from tests.acceptance.deployment import Deployment

pytestmark = [pytest.mark.acceptance, pytest.mark.once, pytest.mark.django_db(transaction=True)]


def test_the_digest_email_is_an_info_line_of_the_worker_log(deployment: Deployment):
    from project.celery import app

    deployment.start_worker("worker-1", concurrency=1)
    deployment.wait_ready()
    app.send_task(
        "project.tasks.send_digest", kwargs={"recipient": "ops@example.com"},
        queue=deployment.queue,
    )
    deployment.wait_for_log("worker-1", "succeeded in", timeout=60)
    log = deployment.log_path("worker-1").read_text()
    assert re.search(
        r": INFO/ForkPoolWorker-1\] Content-Type: text/plain; charset=\"utf-8\"\n"
        r"MIME-Version: 1\.0\nContent-Transfer-Encoding: 7bit\n"
        r"Subject: Digest for now\nFrom: scheduler@example\.com\nTo: ops@example\.com\n", log,
    ), log
    assert [line for line in log.splitlines() if "WARNING" in line] == []
