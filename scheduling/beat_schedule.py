"""``CELERY_BEAT_SCHEDULE`` entries synced into periodic tasks, idempotently, one replica at a time
(``LedgerScheduler.setup_schedule``)."""

from __future__ import annotations

import logging
from typing import Any

from celery import schedules
from django.db import IntegrityError, transaction
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import ModelEntry
from kombu.utils.json import dumps

from scheduling import ledger

logger = logging.getLogger(__name__)


def sync_beat_schedule(beat_schedule: dict[str, dict[str, Any]]) -> None:
    """Create or update a periodic task for each ``CELERY_BEAT_SCHEDULE`` entry, idempotently.

    Replicas sync one at a time (``ledger.beat_schedule_sync``, a transaction-level advisory
    lock), so N replicas starting at once create each task and schedule row once. An entry whose
    task already matches writes nothing, so it moves no change marker and triggers no reload; a
    task whose schedule row is an equal duplicate (same fields) counts as matching. A failing
    entry is rolled back to its savepoint and logged; the others are still synced.
    """
    with ledger.beat_schedule_sync():
        for name, entry in beat_schedule.items():
            try:
                with transaction.atomic():
                    _sync_entry(name, dict(entry))
            except Exception:  # noqa: BLE001 - one bad entry must not stop the others
                logger.exception(
                    "cannot sync beat_schedule entry %r", name, extra={"action": "sync"}
                )


_SCHEDULE_FIELDS = ("interval", "crontab", "solar", "clocked")


def _sync_entry(name: str, entry: dict[str, Any]) -> None:
    existing = PeriodicTask.objects.filter(name=name).first()
    model_schedule, model_field = _model_schedule(
        schedules.maybe_schedule(entry["schedule"]), existing
    )
    fields = _option_fields(entry.get("options") or {})
    fields.update(
        task=entry["task"],
        args=dumps(entry.get("args") or []),
        kwargs=dumps(entry.get("kwargs") or {}),
        **{f: (model_schedule if f == model_field else None) for f in _SCHEDULE_FIELDS},
    )
    if existing is not None and _matches(existing, fields):
        return
    try:
        with transaction.atomic():
            PeriodicTask.objects.update_or_create(name=name, defaults=fields)
    except IntegrityError:  # created meanwhile outside the sync lock (the admin, a script)
        logger.debug("beat_schedule entry %r created by someone else", name)


def _option_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The ``PeriodicTask`` fields of a beat_schedule entry's ``options``, stored as
    django-celery-beat's ``DatabaseScheduler`` stores them (``headers`` as JSON); the other
    options are not kept there, as in stock beat."""
    return {
        "queue": options.get("queue"),
        "exchange": options.get("exchange"),
        "routing_key": options.get("routing_key"),
        "priority": options.get("priority"),
        "headers": dumps(options.get("headers") or {}),
        "expire_seconds": options.get("expire_seconds"),
    }


def _model_schedule(schedule: Any, existing: PeriodicTask | None) -> tuple[Any, str]:
    """Return the schedule row for a Celery schedule, saving it only when it is new.

    The existing task's own row is kept when it has the same fields (a duplicate row made by an
    older, unserialized sync must not make the task flip between rows).
    """
    for schedule_type, model_type, model_field in ModelEntry.model_schedules:
        if isinstance(schedule, schedule_type):
            row = model_type.from_schedule(schedule)
            current = getattr(existing, model_field, None) if existing is not None else None
            if current is not None and _same_row(current, row):
                return current, model_field
            if row.pk is None:
                row.save()
            return row, model_field
    raise ValueError(f"cannot store schedule {schedule!r} as a periodic task schedule")


def _same_row(current: Any, candidate: Any) -> bool:
    """Whether two schedule rows of one model have the same field values (ids aside)."""
    names = [f.attname for f in type(current)._meta.concrete_fields if not f.primary_key]
    return all(str(getattr(current, n)) == str(getattr(candidate, n)) for n in names)


def _matches(task: PeriodicTask, fields: dict[str, Any]) -> bool:
    for key, value in fields.items():
        if key in _SCHEDULE_FIELDS:
            if getattr(task, f"{key}_id") != (value.pk if value is not None else None):
                return False
        elif getattr(task, key) != value:
            return False
    return True
