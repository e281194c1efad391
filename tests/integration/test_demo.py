"""The demo's start: a log folder per run, named by its start time, earlier runs' folders kept;
a second start cancels what the first left pending and says so in its own words, with no raw log
line among its output."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from project.management.commands.demo import retire_previous_tasks, run_logs
from scheduling import ledger
from scheduling.models import Run, TaskHistory

STARTED = datetime(2026, 12, 7, 13, 43, 58, 993954, tzinfo=UTC)


def test_each_run_gets_a_log_folder_named_by_its_start_and_earlier_ones_stay(tmp_path):
    root = tmp_path / "demo-logs"
    first = run_logs(root, STARTED)
    (first / "worker.log").write_text("the first run's worker\n")
    same_second = run_logs(root, STARTED + timedelta(microseconds=5000))
    later = run_logs(root, (STARTED + timedelta(minutes=2)).astimezone())
    assert [first.name, same_second.name, later.name] == [
        "2026-12-07_13-43-58", "2026-12-07_13-43-58_2", "2026-12-07_13-45-58",
    ]
    assert sorted(path.name for path in root.iterdir()) == [
        "2026-12-07_13-43-58", "2026-12-07_13-43-58_2", "2026-12-07_13-45-58",
    ]
    assert (first / "worker.log").read_text() == "the first run's worker\n"


@pytest.mark.django_db(transaction=True)
def test_a_second_start_cancels_the_left_runs_without_printing_a_log_line(
    make_task, capfd, caplog
):
    make_task(every=5, name="demo: digest every 5 s", task="project.tasks.send_digest")
    make_task(every=60, name="demo: record every minute")
    ledger.reconcile(timedelta(seconds=60))
    assert Run.objects.filter(status=Run.Status.PENDING).count() == 2
    capfd.readouterr()

    assert retire_previous_tasks() == 2

    assert capfd.readouterr() == ("", "")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert sorted(Run.objects.values_list("status", "reason")) == [
        ("cancelled", "periodic task disabled"), ("cancelled", "periodic task disabled"),
    ]
    assert logging.getLogger("scheduling").level == logging.INFO
    disabled = TaskHistory.objects.filter(after={"enabled": False})
    assert sorted(disabled.values_list("periodic_task_name", "actor")) == [
        ("demo: digest every 5 s", "the demo, at its start"),
        ("demo: record every minute", "the demo, at its start"),
    ]


@pytest.mark.parametrize("value", ["-5", "0"])
def test_a_duration_of_zero_seconds_or_less_is_refused(value):
    error = f"^Error: argument --duration: must be more than 0 seconds, got {value}$"
    with pytest.raises(CommandError, match=error):
        call_command("demo", "--duration", value)
