"""Exactly-once periodic runs for Django + Celery beat, claimed from a PostgreSQL run ledger."""
