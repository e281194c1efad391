"""project.settings plus five CELERY_BEAT_SCHEDULE entries (issue 3 acceptance 5)."""

from celery.schedules import crontab

from project.settings import *  # noqa: F401,F403

CELERY_BEAT_SCHEDULE = {
    "beat: every 30 s": {"task": "project.tasks.record", "schedule": 30.0},
    "beat: every 45 s": {"task": "project.tasks.record", "schedule": 45.0, "args": ["b"]},
    "beat: hourly": {"task": "project.tasks.record", "schedule": crontab(minute=7)},
    "beat: nightly": {
        "task": "project.tasks.record",
        "schedule": crontab(minute=0, hour=3),
        "kwargs": {"label": "nightly"},
    },
    "beat: also every 30 s": {
        "task": "project.tasks.record",
        "schedule": 30.0,
        "options": {"queue": "reports"},
    },
}
