"""The Celery app of the example deployment: ``celery -A project ...``."""

from __future__ import annotations

import os

from celery import Celery

from project import embedded

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
# The serviceless broker's transport by name: SQLAlchemy is imported only when it is used.
embedded.register_sql_broker()

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
