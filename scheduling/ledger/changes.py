"""The change log (``ScheduleChange``): what reconcile passes re-plan, so their cost follows edits.

Database triggers (migration 0005) write a row for every change of a periodic task's scheduling
columns or of a schedule row, however it was made; the claim and the worker-side adoption write
``unplanned`` rows for tasks left without a pending run. Reconcile passes read the log, and prune
it past ``CHANGE_RETENTION``.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q

from scheduling.clock import ClockTimestamp
from scheduling.models import ScheduleChange

#: How long a definition change is looked at by reconcile passes (and kept): long enough for the
#: editing transaction to have committed, so a plan made from the old definition is caught.
CHANGE_RETENTION = timedelta(minutes=10)


def recent_changes(using: str = "default") -> dict[str, set[int]]:
    """Prune the change log past CHANGE_RETENTION; return the ids it names, by kind."""
    log = ScheduleChange.objects.using(using)
    log.filter(changed_at__lt=ClockTimestamp() - CHANGE_RETENTION).delete()
    changed: dict[str, set[int]] = {}
    for kind, object_id in log.values_list("kind", "object_id"):
        changed.setdefault(kind, set()).add(object_id)
    return changed


def affected(changed: dict[str, set[int]], prefix: str) -> Q:
    """Tasks named in ``changed``, or using a schedule row named there (``prefix`` to the task)."""
    condition = Q()
    for kind, ids in changed.items():
        field = "id" if kind == ScheduleChange.Kind.TASK else f"{kind}_id"
        condition |= Q(**{f"{prefix}{field}__in": sorted(ids)})
    return condition


def note_unplanned(task_ids: set[int], using: str = "default") -> None:
    """Name tasks in the change log so the next reconcile pass plans them (or records why not).

    For a task left without a pending run outside an edit: its schedule failed to give the next
    slot while a run was claimed or adopted.
    """
    ScheduleChange.objects.using(using).bulk_create(
        [
            ScheduleChange(kind=ScheduleChange.Kind.UNPLANNED, object_id=pk)
            for pk in sorted(task_ids)
        ]
    )
