"""The Celery app of the example deployment: ``celery -A project ...``."""

from __future__ import annotations

import os

from celery import Celery

import project.broker  # noqa: F401  (registers the serviceless broker's transport alias)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
