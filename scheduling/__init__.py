"""Exactly-once periodic runs for Django + Celery beat, claimed from a PostgreSQL run ledger."""

from __future__ import annotations

from importlib.metadata import version

#: This release's version, read from the installed distribution's metadata: pyproject.toml's
#: ``version`` is the one place it is written.
__version__ = version("django-scheduling-ledger")
