"""Create or disable the peer's scheduled tasks, through its models (run in ``.venv-dpt``).

``python -m bench.dpt.schedule create PREFIX TASKS EVERY ANCHOR``: ScheduledTask rows
``PREFIX-<i>`` (i < TASKS) of ``bench.dpt.tasks.record``, every EVERY seconds (a divisor of 60:
croniter's sixth field, the seconds, which the package's validation accepts; its README shows
5-field, minute-grained expressions), database-defined as its admin creates them, the first run
due at ANCHOR (epoch seconds, a multiple of EVERY). ``disable PREFIX``: disable them.
"""

import sys
from datetime import UTC, datetime

import django


def main(argv: list[str]) -> None:
    """Run the command ``argv`` names (see the module docstring)."""
    django.setup()
    from django_periodic_tasks.models import ScheduledTask

    action, prefix = argv[0], argv[1]
    if action == "disable":
        for row in ScheduledTask.objects.filter(name__startswith=prefix):
            row.enabled = False
            row.save()
        return
    tasks, every, anchor = int(argv[2]), int(argv[3]), float(argv[4])
    for i in range(tasks):
        row = ScheduledTask(
            name=f"{prefix}-{i}", task_path="bench.dpt.tasks.record",
            cron_expression=f"* * * * * */{every}", kwargs={"label": f"{prefix}-{i}"},
            next_run_at=datetime.fromtimestamp(anchor, UTC),
        )
        row.clean()  # its cron, timezone and task path checks (full_clean needs the admin)
        row.save()


if __name__ == "__main__":
    main(sys.argv[1:])
