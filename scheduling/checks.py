"""System checks: the settings this app cannot work without."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.db import connections


@register()
def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """USE_TZ must be on: slots are aware UTC instants."""
    if settings.USE_TZ:
        return []
    return [
        Error(
            "scheduling needs USE_TZ = True: run slots are stored as aware UTC datetimes.",
            hint="Set USE_TZ = True in your settings (Django's default since 5.0).",
            id="scheduling.E001",
        )
    ]


@register(deploy=False)
def check_postgresql(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The default database must be PostgreSQL: claims use SELECT ... FOR UPDATE SKIP LOCKED."""
    connection = connections["default"]
    if connection.vendor == "postgresql" and connection.features.has_select_for_update_skip_locked:
        return []
    return [
        Error(
            f"scheduling needs PostgreSQL (SELECT ... FOR UPDATE SKIP LOCKED); the default "
            f"database is {connection.vendor}.",
            hint="Point DATABASE_URL (or DATABASES['default']) at PostgreSQL 14 or newer.",
            id="scheduling.E002",
        )
    ]
