from __future__ import annotations

from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # registers checks and signal handlers
        from scheduling import admin_permissions, checks, worker  # noqa: F401
        from scheduling import webhook
        from scheduling.conf import conf

        if conf.webhook_url:
            webhook.connect()
