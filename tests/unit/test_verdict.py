"""The guard's rule table in docs/guard.md is ``verdict.CASES``, row for row, and each row is what
``verdict.verdict`` answers on every delivery it decides (no database).

The page's cells are a small vocabulary (``RUNS``, ``DELIVERIES``), so each row reads as a
predicate on a delivery. Every delivery of a grid (each run status, with reason "", "not
delivered" or "worker lost", 0 or 1 executions, either policy; no run, its slot ahead of the
ledger or not; the delivery's attempt before, at and after the run's; redelivered or not; the
lock free or held) is decided by the first row that matches it, as the page says, and each row's
case asserts the verdict's case, outcome, reason and writes on every delivery the row decides.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from scheduling.ledger.verdict import (
    CASES,
    DUPLICATE,
    Case,
    Outcome,
    RunFacts,
    Verdict,
    Write,
    verdict,
)
from scheduling.models import Run, TaskPolicy

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guard.md"
HEADER = "| Case | Run | Delivery | Result | Reason | On the run |"
#: The run's attempt in the grid: deliveries at 0, 1 and 2 are an earlier, the same, a later one.
ATTEMPT = 1


class Delivery(NamedTuple):
    run: RunFacts | None
    retries: int
    redelivered: bool
    exclusive: bool
    ahead_of_ledger: bool


class Row(NamedTuple):
    case: str
    run: str
    delivery: str
    result: str
    reason: str
    writes: str


def page_rows() -> list[Row]:
    """The rows of the rule table of docs/guard.md, backticks dropped from the cells."""
    lines = PAGE.read_text().split(HEADER + "\n", 1)[1].splitlines()
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines))[1:]
    return [
        Row(*(cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")))
        for line in table
    ]


def grid() -> list[Delivery]:
    runs = [
        RunFacts(status, reason, executions, ATTEMPT, policy)
        for status, reason, executions, policy in itertools.product(
            Run.Status.values, ("", Run.Reason.NOT_DELIVERED, Run.Reason.WORKER_LOST), (0, 1),
            TaskPolicy.WorkerLost.values,
        )
    ]
    with_runs = [
        Delivery(run, retries, redelivered, exclusive, False)
        for run, retries, redelivered, exclusive in itertools.product(
            runs, (0, 1, 2), (False, True), (False, True)
        )
    ]
    without = [
        Delivery(None, retries, redelivered, exclusive, ahead)
        for retries, redelivered, exclusive, ahead in itertools.product(
            (0, 1, 2), (False, True), (False, True), (False, True)
        )
    ]
    return with_runs + without


Predicate = Callable[[Delivery], bool]


def _failed(reason: str, executions: tuple[int, ...]) -> Predicate:
    return lambda d: d.run is not None and (d.run.status, d.run.reason) == (
        Run.Status.FAILED, reason
    ) and d.run.executions in executions


#: The Run column's words that are not a list of statuses.
RUNS: dict[str, Predicate] = {
    "none, its slot ahead of the ledger": lambda d: d.run is None and d.ahead_of_ledger,
    "none": lambda d: d.run is None,
    "any": lambda d: d.run is not None,
    'failed "not delivered", never executed': _failed(Run.Reason.NOT_DELIVERED, (0,)),
    'failed "worker lost"': _failed(Run.Reason.WORKER_LOST, (0, 1)),
}
#: The Delivery column's words, joined by ", " in a cell (each must hold); read after the run's.
DELIVERIES: dict[str, Predicate] = {
    "any": lambda d: True,
    "lock held": lambda d: not d.exclusive,
    "lock free": lambda d: d.exclusive,
    "a later attempt": lambda d: d.run is not None and d.retries > d.run.attempt,
    "the same attempt": lambda d: d.run is not None and d.retries == d.run.attempt,
    "redelivered": lambda d: d.redelivered,
    "policy recover": lambda d: d.run is not None and d.run.worker_lost_policy == "recover",
    "policy fail": lambda d: d.run is not None and d.run.worker_lost_policy == "fail",
}


def matches(row: Row) -> Predicate:
    """The row's Run and Delivery cells as one predicate."""
    if row.run in RUNS:
        run = RUNS[row.run]
    else:
        statuses = row.run.split(", ")
        assert set(statuses) <= set(Run.Status.values), row.run
        run = lambda d: d.run is not None and d.run.status in statuses
    parts = [DELIVERIES[word] for word in row.delivery.split(", ")]
    return lambda d: run(d) and all(part(d) for part in parts)


def expected(row: Row, d: Delivery) -> tuple[str, Outcome, str, tuple[Write, ...]]:
    """What the row says of delivery ``d``: case, outcome, reason (its placeholders filled in)
    and writes."""
    reason = row.reason.replace("*retries*", str(d.retries))
    if d.run is not None:
        reason = reason.replace("*attempt*", str(d.run.attempt)).replace("*status*", d.run.status)
    return row.case, Outcome(row.result), reason, row_writes(row)


def row_writes(row: Row) -> tuple[Write, ...]:
    return () if row.writes == "nothing" else tuple(map(Write, row.writes.split(", ")))


ROWS = page_rows()
PREDICATES = [matches(row) for row in ROWS]
GRID = grid()


def deciding_row(d: Delivery) -> Row | None:
    """The first row of the page that matches ``d``."""
    return next((row for row, match in zip(ROWS, PREDICATES, strict=True) if match(d)), None)


def test_the_page_has_one_row_per_case_of_the_function_in_its_order():
    """A case of ``CASES`` missing from the page, a row the function lacks, or two in another
    order fail here, as does a row whose result or writes are not its case's."""
    assert [(r.case, Outcome(r.result), row_writes(r)) for r in ROWS] == [
        (case.name, case.outcome, case.writes) for case in CASES
    ]


def test_every_delivery_of_the_grid_is_decided_by_a_row():
    assert len(GRID) == 11 * 3 * 2 * 2 * 12 + 24
    assert [d for d in GRID if deciding_row(d) is None] == []


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_each_row_is_the_verdict_on_every_delivery_it_decides(row: Row):
    decided = [d for d in GRID if deciding_row(d) is row]
    assert decided, f"no delivery reaches the row {row.case!r}: a row above takes them all"
    wrong = [
        (d, answer)
        for d in decided
        if (answer := verdict(
            d.run, retries=d.retries, redelivered=d.redelivered, exclusive=d.exclusive,
            ahead_of_ledger=d.ahead_of_ledger,
        )) and (answer.case.name, answer.outcome, answer.reason, answer.writes)
        != expected(row, d)
    ]
    assert wrong == []


def test_a_redelivered_earlier_attempt_leaves_the_later_one_running():
    """A redelivery of attempt 0 (its lock free: that attempt is over) while attempt 1 runs is a
    duplicate under either policy: it neither closes the run nor executes."""
    for policy in TaskPolicy.WorkerLost.values:
        running = RunFacts(Run.Status.RUNNING, "", 2, 1, policy)
        assert verdict(
            running, retries=0, redelivered=True, exclusive=True, ahead_of_ledger=False
        ) == Verdict(DUPLICATE, "duplicate of a running run (attempt 1)")


def test_only_the_two_executing_outcomes_run_the_body():
    assert [o for o in Outcome if Verdict(Case("any", o), "").execute] == [
        Outcome.EXECUTE, Outcome.UNTRACKED
    ]
