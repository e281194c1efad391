"""The guard-cost scenario's reading of a worker's log (``bench.guard_cost.worker_log``)."""

from __future__ import annotations

from datetime import datetime

from bench.guard_cost import worker_log

LOG = """\
[2026-12-01 19:50:15,001: INFO/MainProcess] Task project.tasks.noop[a5face6e-455c-5e2f-ad7b-f1c2ede8a2ac] received
[2026-12-01 19:50:15,002: INFO/MainProcess] Task project.tasks.record[2e8c790c-0cfb-58f3-bc7c-3121706c2f5a] received
[2026-12-01 19:50:15,108: INFO/ForkPoolWorker-2] Task project.tasks.noop[a5face6e-455c-5e2f-ad7b-f1c2ede8a2ac] succeeded in 0.1187s: None
[2026-12-01 19:50:15,110: WARNING/ForkPoolWorker-1] run 10f2669f: duplicate delivery suppressed
[2026-12-01 19:50:15,211: INFO/ForkPoolWorker-1] Task project.tasks.noop[10f2669f-d368-52f8-aa40-e0267b178cfa] succeeded in 0.0783s: None
"""


def test_the_no_op_tasks_received_and_succeeded_lines_in_order():
    assert worker_log(LOG) == [
        ("received", "a5face6e-455c-5e2f-ad7b-f1c2ede8a2ac", datetime(2026, 12, 1, 19, 50, 15, 1000)),
        ("succeeded", "a5face6e-455c-5e2f-ad7b-f1c2ede8a2ac",
         datetime(2026, 12, 1, 19, 50, 15, 108000)),
        ("succeeded", "10f2669f-d368-52f8-aa40-e0267b178cfa",
         datetime(2026, 12, 1, 19, 50, 15, 211000)),
    ]
