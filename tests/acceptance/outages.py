"""Checks shared by the outage tests: what the ledger must show after an outage ended.

Rows are ``scheduling.models.Run`` objects or anything with the same attributes
(``scheduled_for``, ``status``, ``dispatched_at``, ``finished_at``, ``slots``, ``reason``,
``lateness``); datetimes are aware UTC from the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any


def assert_whole_grid(rows: Sequence[Any], first: datetime, every: timedelta) -> None:
    """Assert no slot appears twice and none is missing, except those a coalesced run stands for."""
    expected, slot = [], first
    for row in rows:
        expected.append(slot)
        slot += row.slots * every
    assert [r.scheduled_for for r in rows] == expected


def assert_misfire_policies(
    rows: dict[str, Sequence[Any]],
    *,
    start: datetime,
    every: timedelta,
    grace: timedelta,
    down: datetime,
    up: datetime,
    publish_slack: timedelta = timedelta(0),
) -> None:
    """Assert each interval task's ledger after an outage from ``down`` to ``up`` (exact counts).

    ``rows`` maps ``coalesce``, ``skip`` (misfire policies with ``grace``) and ``in_grace`` (a
    grace longer than the outage) to one task's runs in slot order, all every ``every`` from
    ``start``. coalesce: one late run, after ``up``, standing for every slot up to its dispatch;
    skip: every slot past its grace when claimed after ``up`` recorded missed, nothing ran late;
    in_grace: every slot of the outage dispatched on its own after ``up``.

    A claim decides a run's misfire at its own clock, and the run's ``dispatched_at`` is when its
    publish returned: after a broker outage the first publishes can take up to
    ``publish_slack`` longer (the reconnect), so a run decided within its grace is late by up to
    ``grace + publish_slack`` (seen on a busy machine: a skip-policy run dispatched past 5 s).
    """
    past_grace = grace + publish_slack
    outage = (up - down) / every  # slots the outage spans
    coalesce, skip, in_grace = rows["coalesce"], rows["skip"], rows["in_grace"]

    assert_whole_grid(coalesce, start, every)
    late = [r for r in coalesce if r.lateness is not None and r.lateness > past_grace]
    assert len(late) == 1, late
    (merged,) = late
    assert merged.dispatched_at >= up
    # It stands for every slot up to the claim's clock, which the ledger does not keep: its
    # ``dispatched_at`` is later, when the publish returned, and a slot can begin in between (seen
    # with a 1 s interval on a loaded machine). So: every slot up to its dispatch, or one fewer.
    up_to_dispatch = 1 + int((merged.dispatched_at - merged.scheduled_for) / every)
    assert merged.slots in (up_to_dispatch, up_to_dispatch - 1), (merged.slots, up_to_dispatch)
    assert merged.slots >= int(outage)  # at least the slots inside the outage
    assert merged.reason == f"misfire: coalesced {merged.slots} slots"
    assert [r for r in coalesce if r.status == "missed"] == []

    assert_whole_grid(skip, start, every)
    assert [(r.scheduled_for, r.lateness) for r in skip
            if r.lateness is not None and r.lateness > past_grace] == []
    missed = [r for r in skip if r.status == "missed"]
    # each missed slot was recorded by a claim after the return, past the slot's grace
    assert [r for r in missed if not (r.finished_at - r.scheduled_for > grace)] == []
    assert min(r.finished_at for r in missed) >= up
    assert all(down - every < r.scheduled_for < up for r in missed)
    assert len(missed) >= int(outage - grace / every)
    assert {r.reason.split(",")[0] for r in missed} == {"misfire: skip policy"}

    assert_whole_grid(in_grace, start, every)
    assert [r.slots for r in in_grace] == [1] * len(in_grace)
    during = [r for r in in_grace if down < r.scheduled_for < up]
    assert len(during) >= int(outage) - 1
    assert all(r.dispatched_at >= up for r in during)
