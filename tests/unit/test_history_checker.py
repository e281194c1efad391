"""The history checker (tools.history) on hand-made histories: each breach kind is caught, with
its count and the runs it names, and a correct history with every kind of event passes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tools import history

TASK = "chaos-test #0 interval"
START = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
SLOT = "2026-12-01T16:00:00.000000+00:00"


def _at(second: float) -> str:
    return history.instant(START + timedelta(seconds=second))


def _event(kind: str, second: float, run: int = 1, slot: str = SLOT, **more) -> dict:
    return {
        "kind": kind,
        "at": _at(second),
        "process": more.pop("process", "replica-1"),
        "run": run,
        "task_id": more.pop("task_id", f"t{run}"),
        "task": TASK,
        "slot": slot,
        "trigger": "schedule",
        **more,
    }


def _executed(second: float, task_id: str = "t1", pgid: int = 100) -> dict:
    return {
        "kind": "executed",
        "at": _at(second),
        "process": f"process group {pgid}",
        "task_id": task_id,
        "pgid": pgid,
    }


def _dispatch(run: int = 1, at: float = 1.0, process: str = "replica-1", **more) -> list[dict]:
    """A run planned, claimed, published and committed by ``process`` from second ``at``."""
    return [
        _event("planned", at - 1, run, **more),
        _event("claimed", at, run, process=process, **more),
        _event("published", at + 0.1, run, process=process, **more),
        _event("committed", at + 0.2, run, process=process, reason="", **more),
    ]


def _correct() -> list[dict]:
    """Every kind of event, no breach: a run executed once with a suppressed copy; a run whose
    message was lost, re-published and executed; a run closed not delivered; an adopted run; a
    run whose worker was SIGKILLed after its body ended, executed again (recover); a missed slot."""
    second = "2026-12-01T16:00:10.000000+00:00"
    third = "2026-12-01T16:00:20.000000+00:00"
    fourth = "2026-12-01T16:00:30.000000+00:00"
    fifth = "2026-12-01T16:00:40.000000+00:00"
    sixth = "2026-12-01T16:00:50.000000+00:00"
    return [
        *_dispatch(1),
        _event("started", 2.0, 1, process="worker-1"),
        _executed(2.5, "t1"),
        _event("finished", 2.6, 1, process="worker-1", status="succeeded"),
        _event("suppressed", 3.0, 1, process="worker-2", status="succeeded"),
        *_dispatch(2, 11.0, slot=second),
        _event("re-published", 21.0, 2, slot=second, reason="re-published (1 of 3)"),
        _event("started", 22.0, 2, slot=second, process="worker-1"),
        _executed(22.5, "t2"),
        _event("finished", 22.6, 2, slot=second, status="succeeded"),
        *_dispatch(3, 21.0, slot=third),
        _event("re-published", 31.0, 3, slot=third),
        _event("closed", 51.0, 3, slot=third, status="failed", reason="not delivered"),
        _event("planned", 29.0, 4, slot=fourth),
        _event("adopted", 31.0, 4, slot=fourth, process="worker-2"),
        _event("started", 31.0, 4, slot=fourth, process="worker-2"),
        _executed(31.5, "t4", pgid=200),
        _event("finished", 31.6, 4, slot=fourth, status="succeeded"),
        *_dispatch(5, 41.0, slot=fifth),
        _event("started", 41.5, 5, slot=fifth, process="worker-2"),
        _executed(42.0, "t5", pgid=200),
        {"kind": "killed", "at": _at(42.1), "process": "worker-2", "pgid": 200},
        _event("re-published", 48.0, 5, slot=fifth, reason="recovered"),
        _event("started", 49.0, 5, slot=fifth, process="worker-1"),
        _executed(49.5, "t5", pgid=100),
        _event("finished", 49.6, 5, slot=fifth, status="succeeded"),
        _event("planned", 50.0, 6, slot=sixth),
        _event("closed", 50.0, 6, slot=sixth, status="missed", reason="misfire: skip policy"),
    ]


def _breaches(verdict: history.Verdict) -> dict[str, int]:
    return {kind: len(named) for kind, named in verdict.breaches.items() if named}


def test_a_correct_history_passes_with_every_event_counted():
    verdict = history.check(_correct())

    assert _breaches(verdict) == {}
    assert verdict.ok
    assert (verdict.slots, verdict.runs) == (6, 6)
    assert dict(verdict.events) == {
        "planned": 6,
        "claimed": 4,
        "published": 4,
        "committed": 4,
        "adopted": 1,
        "started": 5,
        "suppressed": 1,
        "executed": 5,
        "finished": 4,
        "re-published": 3,
        "closed": 2,
        "killed": 1,
    }
    assert verdict.summary().splitlines()[-1] == "history: PASS"


def test_a_slot_claimed_twice_is_a_breach_even_when_the_ledger_kept_one_claim():
    # The second replica's claim overwrote the first (claimed_by, dispatched_at): the final row
    # shows one claim, the history two.
    events = [*_correct(), _event("claimed", 5.0, 1, process="replica-2")]

    verdict = history.check(events)

    assert _breaches(verdict) == {"slot claimed twice": 1}
    assert verdict.breaches["slot claimed twice"] == [
        f"run 1 ({TASK} @ {SLOT}, task id t1) claimed 2x"
    ]
    assert not verdict.ok


def test_a_slot_committed_by_two_runs_is_a_breach_and_names_both():
    events = [*_correct(), *_dispatch(7, 1.5, process="replica-2", task_id="t1")[1:]]

    verdict = history.check(events)

    assert _breaches(verdict) == {"slot claimed twice": 1, "slot committed twice": 1}
    assert verdict.breaches["slot committed twice"] == [
        (
            f"run 1 ({TASK} @ {SLOT}, task id t1) committed 1x; "
            f"run 7 ({TASK} @ {SLOT}, task id t1) committed 1x"
        )
    ]


def test_an_adoption_after_a_commit_is_a_second_commit():
    events = [*_correct(), _event("adopted", 1.5, 1, process="worker-1")]

    verdict = history.check(events)

    assert _breaches(verdict) == {"slot committed twice": 1}
    assert verdict.breaches["slot committed twice"] == [
        f"run 1 ({TASK} @ {SLOT}, task id t1) committed 2x"
    ]


def test_a_re_publish_is_neither_a_claim_nor_a_commit():
    events = [*_correct(), _event("re-published", 4.0, 1), _event("re-published", 5.0, 1)]

    assert _breaches(history.check(events)) == {}


def test_two_executions_by_live_workers_are_a_breach():
    events = [*_correct(), _executed(3.5, "t1", pgid=300), _executed(22.7, "t2", pgid=300)]

    verdict = history.check(events)

    assert _breaches(verdict) == {"run executed twice": 2}
    assert verdict.breaches["run executed twice"] == [
        (
            f"run 1 ({TASK} @ {SLOT}, task id t1): executed 2x (process groups 100, 300), "
            "2 by workers not SIGKILLed after"
        ),
        (
            f"run 2 ({TASK} @ 2026-12-01T16:00:10.000000+00:00, task id t2): executed 2x "
            "(process groups 100, 300), 2 by workers not SIGKILLed after"
        ),
    ]


def test_an_execution_whose_worker_was_killed_before_it_is_still_counted():
    # Process group 200 was killed at 42.1 s: its execution of t2 at 43 s came after the kill
    # (another process with that group id cannot exist in the history), so it counts.
    events = [*_correct(), _executed(43.0, "t2", pgid=200)]

    assert _breaches(history.check(events)) == {"run executed twice": 1}


def test_a_committed_run_never_executed_nor_closed_is_a_breach():
    lost = "2026-12-01T16:01:00.000000+00:00"
    events = [
        *_correct(),
        *_dispatch(8, 60.0, slot=lost),
        _event("re-published", 70.0, 8, slot=lost),
        # a closing without a reason does not account for it either
        _event("closed", 80.0, 8, slot=lost, status="failed", reason=""),
    ]

    verdict = history.check(events)

    assert _breaches(verdict) == {
        "committed, never executed nor closed": 1,
        "closed without a reason": 1,
    }
    assert verdict.breaches["committed, never executed nor closed"] == [
        (
            f"run 8 ({TASK} @ {lost}, task id t8): committed at 2026-12-01T16:01:00.200000+00:00 "
            "by replica-1, re-published 1x, last 2026-12-01T16:01:10.000000+00:00"
        )
    ]
    assert verdict.breaches["closed without a reason"] == [
        f"run 8 ({TASK} @ {lost}, task id t8): failed at 2026-12-01T16:01:20.000000+00:00"
    ]


def test_a_run_after_the_window_may_be_left_undelivered():
    # The chaos tool stops its processes after the window: a run of a later slot it dispatched
    # meanwhile need not have executed. The same run inside the window is lost after dispatch.
    window = {"kind": "window", "at": _at(59.0), "process": "chaos", "until": _at(59.0)}
    after = [*_correct(), window, *_dispatch(8, 60.0, slot=_at(60.0))]
    inside = [*_correct(), window, *_dispatch(8, 58.0, slot=_at(58.0))]

    verdict = history.check(after)

    assert (_breaches(verdict), verdict.after_window) == ({}, 1)
    assert _breaches(history.check(inside)) == {"committed, never executed nor closed": 1}


def test_an_execution_of_a_run_never_committed_is_a_breach():
    never = "2026-12-01T16:01:00.000000+00:00"
    events = [
        *_correct(),
        _event("planned", 59.0, 9, slot=never),
        _executed(61.0, "t9"),  # a pending run executed: no commit, no adoption
        _executed(62.0, "stray"),  # a task id no run has
        _executed(0.5, "t1", pgid=400),  # before its run's commit at 1.2 s
    ]

    verdict = history.check(events)

    assert _breaches(verdict) == {"executed, never committed": 3, "run executed twice": 1}
    assert verdict.breaches["executed, never committed"] == [
        (
            f"run 1 ({TASK} @ {SLOT}, task id t1): executed at {_at(0.5)} by process group 400, "
            f"committed first at {_at(1.2)}"
        ),
        (
            f"run 9 ({TASK} @ {never}, task id t9): executed at 2026-12-01T16:01:01.000000+00:00 "
            "by process group 100, never committed"
        ),
        (
            "task id stray (no run has it): executed at 2026-12-01T16:01:02.000000+00:00 by process "
            "group 100, never committed"
        ),
    ]


def test_the_command_prints_the_summary_and_exits_nonzero_on_a_breach(tmp_path, capsys):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps(e) + "\n" for e in _correct()) + '{"kind": "cut\n')
    bad.write_text("".join(json.dumps(e) + "\n" for e in [*_correct(), _executed(3.5)]))

    assert history.main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "history events                                40" in out
    assert out.splitlines()[-1] == "history: PASS"

    assert history.main([str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "  run executed twice                           1" in out
    assert out[-2:] == [
        (
            f"run executed twice: run 1 ({TASK} @ {SLOT}, task id t1): executed 2x (process groups "
            "100, 100), 2 by workers not SIGKILLed after"
        ),
        "history: FAIL",
    ]


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["--help"]])
def test_the_command_wants_one_file(argv, capsys):
    assert history.main(argv) == 2
    assert "usage: python -m tools.history" in capsys.readouterr().err
