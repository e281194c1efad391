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
    # The e-mail's first line is the INFO line; its other headers follow, in an order that
    # differs between Python versions.
    first = r": INFO/ForkPoolWorker-1\] Content-Type: text/plain; charset=\"utf-8\"\n"
    mail = re.search(first + r"((?:[\w-]+: .*\n)+)", log)
    assert mail, log
    assert {"Subject: Digest for now", "From: scheduler@example.com", "To: ops@example.com",
            "MIME-Version: 1.0"} <= set(mail[1].splitlines()), log
    assert [line for line in log.splitlines() if "WARNING" in line] == []
