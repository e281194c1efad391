"""The benchmark's counting of duplicate executions and lost runs (``bench.counts``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.counts import Counts, by_slot, by_time

EVERY = 5.0


def sends(first: float, count: int, every: float = EVERY) -> list[float]:
    return [first + i * every for i in range(count)]


def test_one_sender_on_time_is_every_slot_once():
    # The window is 10 intervals, half an interval off the sends.
    assert by_time(sends(1002.5, 10), EVERY, 1000.0, 1050.0) == Counts(10, 10, 0, 0)


def test_three_senders_in_phase_are_two_duplicates_per_slot():
    times = sends(1002.5, 10) + sends(1002.51, 10) + sends(1002.6, 10)
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 30, 20, 0)


def test_a_sender_woken_after_a_pause_sends_its_catch_up_beside_the_others():
    # Two senders on time; the third one is stopped for 4 intervals, then sends its overdue
    # run at once (1.2 s after the others) and stays at that phase.
    others = sends(1002.5, 10) + sends(1002.52, 10)
    woken = sends(1002.5, 2) + sends(1003.7 + 6 * EVERY, 4)
    assert by_time(others + woken, EVERY, 1000.0, 1050.0) == Counts(10, 26, 16, 0)


def test_a_gap_loses_the_runs_it_spans():
    # Sends at slots 0-2, nothing for slots 3-7, one catch-up at slot 8, then 9.
    times = sends(1002.5, 3) + [1002.5 + 8.3 * EVERY, 1002.5 + 9.3 * EVERY]
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 5, 0, 5)


def test_silence_at_the_start_and_the_end_of_the_window_is_lost():
    times = sends(1002.5 + 2 * EVERY, 5)  # slots 2 to 6 only
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 5, 0, 5)


def test_nothing_sent_is_every_slot_lost_and_outside_the_window_is_ignored():
    assert by_time([990.0, 1051.0], EVERY, 1000.0, 1050.0) == Counts(10, 0, 0, 10)


def test_by_slot_matches_each_execution_to_its_nominal_slot():
    base = datetime(2026, 12, 1, 12, tzinfo=UTC)
    expected = [base + timedelta(seconds=5 * i) for i in range(4)]
    executed = [expected[0], expected[1], expected[1], expected[3], base - timedelta(seconds=5)]
    assert by_slot(executed, expected) == Counts(slots=4, executions=4, duplicates=1, lost=1)


def test_counts_add_up():
    assert Counts(1, 2, 3, 4) + Counts(10, 20, 30, 40) == Counts(11, 22, 33, 44)


def test_a_run_whose_copies_straddle_the_window_start_is_counted_once_outside_it():
    # Copies of one run at 999.7 and 1000.4: it is the window's run only if its first copy is.
    times = [999.7, 1000.4] + sends(1004.7, 10)
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 10, 0, 0)


def test_a_late_sender_loses_nothing_but_sends_fewer_runs():
    # Each send 0.3 s later than a whole interval after the previous one (stock beat's drift).
    times = sends(1002.5, 12, every=EVERY + 0.3)
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 9, 0, 0)


def test_silence_after_the_last_run_is_lost_up_to_the_window_end():
    # The sender dies after slot 3; it was stopped (horizon) well after the window's end.
    times = sends(1002.5, 4)
    assert by_time(times, EVERY, 1000.0, 1050.0, horizon=1080.0) == Counts(10, 4, 0, 6)


def test_copies_of_senders_drifted_apart_are_duplicates_all_the_same():
    # Three senders, 0 s, 2.6 s and 4.0 s apart (more than half an interval): by time they
    # look like runs of their own, but 10 intervals hold 10 runs, not 30.
    times = sends(1000.5, 10) + sends(1003.1, 10) + sends(1004.5, 10)
    assert by_time(times, EVERY, 1000.0, 1050.0) == Counts(10, 30, 20, 0)


def test_a_catch_up_half_an_interval_late_is_no_duplicate():
    # RedBeat woken after a pause: its catch-up comes 10.5 s (3.5 intervals) after the last run,
    # then it goes on from there. Three slots counted lost; nothing sent twice.
    times = [997.5, 1000.57, 1011.07, 1014.21, 1017.3, 1020.34]
    assert by_time(times, 3.0, 1000.0, 1018.0, horizon=1030.0) == Counts(6, 4, 0, 3)
