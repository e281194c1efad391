"""Witnessed row changes into history events (tools.capture.events): each transition of the run
lifecycle gives the events it stands for, from the session that made it."""

from __future__ import annotations

import pytest

from scheduling.models import Run
from tools import capture

AT = "2026-12-01T16:00:05.000000+00:00"
XACT = "2026-12-01T16:00:04.000000+00:00"
ROW = {
    "id": 7,
    "task_id": "t7",
    "periodic_task_name": "chaos-x #1 interval",
    "scheduled_for": "2026-12-01T16:00:00+00:00",
    "trigger": "schedule",
    "status": "pending",
    "reason": "",
    "claimed_by": "",
    "worker": "",
    "dispatched_at": None,
    "started_at": None,
    "finished_at": None,
    "republished": 0,
    "republished_at": None,
    "suppressed": 0,
    "retries": 0,
}
LATER = "2026-12-01T16:00:06+00:00"


def _change(old: dict | None, new: dict, app: str = "scheduling-beat:replica-2") -> capture.Change:
    before = None if old is None else {**ROW, **old}
    return capture.Change(1, AT, XACT, app, 4242, 99, before, {**ROW, **new})


def _kinds(change: capture.Change) -> list[tuple[str, str]]:
    return [(e["kind"], e["process"]) for e in capture.events([change])]


DISPATCHED = {"status": "dispatched", "claimed_by": "replica-1", "dispatched_at": AT}
RUNNING = {**DISPATCHED, "status": "running", "worker": "worker-1", "started_at": AT}
WORKER = "worker-2"  # the application_name the chaos tool gives a worker's sessions


@pytest.mark.parametrize(
    ("old", "new", "app", "kinds"),
    [
        (None, {}, "scheduling-beat:replica-2", [("planned", "replica-2")]),
        (
            None,
            {"status": "missed", "reason": "misfire: skip"},
            "scheduling-beat:replica-2",
            [("planned", "replica-2"), ("closed", "replica-2")],
        ),
        (
            {},
            DISPATCHED,
            "scheduling-beat:replica-1",
            [("claimed", "replica-1"), ("published", "replica-1"), ("committed", "replica-1")],
        ),
        (
            {},
            {"status": "skipped", "claimed_by": "replica-1", "reason": "overlap"},
            "scheduling-beat:replica-1",
            [("claimed", "replica-1"), ("closed", "replica-1")],
        ),
        # a reconcile pass cancels an edited task's pending run: no claim
        (
            {},
            {"status": "cancelled", "reason": Run.Reason.SCHEDULE_EDITED},
            "scheduling-beat:replica-3",
            [("closed", "replica-3")],
        ),
        (
            {},
            {"status": "running", "worker": "worker-1", "started_at": AT},
            WORKER,
            [("adopted", "worker-1"), ("started", "worker-1")],
        ),
        (
            DISPATCHED,
            {**DISPATCHED, "republished": 1, "republished_at": LATER},
            "scheduling-beat:replica-4",
            [("re-published", "replica-4")],
        ),
        (
            DISPATCHED,
            {
                **DISPATCHED,
                "status": "failed",
                "reason": Run.Reason.NOT_DELIVERED,
                "finished_at": LATER,
            },
            "scheduling-beat:replica-4",
            [("closed", "replica-4")],
        ),
        (DISPATCHED, RUNNING, WORKER, [("started", "worker-1")]),
        (
            RUNNING,
            {**RUNNING, "suppressed": 2},
            WORKER,
            [("suppressed", WORKER), ("suppressed", WORKER)],
        ),
        (
            RUNNING,
            {**RUNNING, "status": "succeeded", "finished_at": LATER},
            WORKER,
            [("finished", WORKER)],
        ),
        (
            RUNNING,
            {**RUNNING, "status": "failed", "finished_at": LATER},
            WORKER,
            [("finished", WORKER)],
        ),  # the body raised
        (
            RUNNING,
            {**RUNNING, "status": "failed", "reason": Run.Reason.WORKER_LOST, "finished_at": LATER},
            "scheduling-beat:replica-5",
            [("closed", "replica-5")],
        ),
        # the guard closes it on the broker's redelivery (policy fail), dropping the copy
        (
            RUNNING,
            {
                **RUNNING,
                "status": "failed",
                "reason": Run.Reason.WORKER_LOST,
                "finished_at": LATER,
                "suppressed": 1,
            },
            WORKER,
            [("suppressed", WORKER), ("closed", WORKER)],
        ),
        # recover: re-published by the sweep, back to dispatched
        (
            RUNNING,
            {
                **RUNNING,
                "status": "dispatched",
                "republished": 1,
                "republished_at": LATER,
                "reason": Run.Reason.RECOVERED,
            },
            "scheduling-beat:replica-5",
            [("re-published", "replica-5")],
        ),
        # re-executed on the same attempt after its worker died (recover)
        (
            RUNNING,
            {**RUNNING, "worker": "worker-2", "started_at": LATER, "reason": Run.Reason.REEXECUTED},
            WORKER,
            [("started", "worker-2")],
        ),
        (
            {**RUNNING, "status": "failed", "reason": Run.Reason.WORKER_LOST, "finished_at": AT},
            {
                **RUNNING,
                "status": "succeeded",
                "reason": Run.Reason.LATE_OUTCOME,
                "finished_at": LATER,
            },
            WORKER,
            [("finished", WORKER)],
        ),
        (
            {
                **DISPATCHED,
                "status": "failed",
                "reason": Run.Reason.NOT_DELIVERED,
                "finished_at": AT,
            },
            {**RUNNING, "reason": Run.Reason.LATE_DELIVERY},
            WORKER,
            [("started", "worker-1")],
        ),
        (
            DISPATCHED,
            {
                **DISPATCHED,
                "status": "expired",
                "reason": Run.Reason.MESSAGE_EXPIRED,
                "finished_at": LATER,
            },
            "",
            [("closed", "backend 4242")],
        ),
    ],
)
def test_each_transition_gives_its_events(old, new, app, kinds):
    assert _kinds(_change(old, new, app)) == kinds


def test_events_carry_the_database_clock_of_each_step():
    events = list(capture.events([_change({}, {**DISPATCHED, "dispatched_at": LATER})]))

    assert [(e["kind"], e["at"]) for e in events] == [
        ("claimed", XACT),  # the claim transaction's start: its SKIP LOCKED query
        ("published", "2026-12-01T16:00:06.000000+00:00"),  # dispatched_at
        ("committed", AT),  # the session's clock at the claim's write
    ]
    assert {e["slot"] for e in events} == {"2026-12-01T16:00:00.000000+00:00"}
    assert {(e["run"], e["task_id"], e["txid"]) for e in events} == {(7, "t7", 99)}
