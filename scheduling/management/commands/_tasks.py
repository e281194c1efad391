"""Shared by the scheduling commands: find a periodic task by name or id."""

from __future__ import annotations

from django.core.management.base import CommandError
from django_celery_beat.models import PeriodicTask


def periodic_task(name_or_id: str) -> PeriodicTask:
    """Return the periodic task named ``name_or_id``, or with that id when no name matches.

    Raises CommandError when there is none.
    """
    task = PeriodicTask.objects.filter(name=name_or_id).first()
    if task is None and name_or_id.isdigit():
        task = PeriodicTask.objects.filter(pk=int(name_or_id)).first()
    if task is None:
        raise CommandError(f"no periodic task named {name_or_id!r} (nor with that id)")
    return task
