"""project.settings plus one CELERY_BEAT_SCHEDULE entry, synced by a replica whose clock is skewed.

The replica that syncs it writes the periodic task (``date_changed``, an interval's anchor) from
its own process: the clock-skew test checks the anchor is the database's, not that process's.
"""

from project.settings import *

CELERY_BEAT_SCHEDULE = {
    "skew: synced every 4 s": {"task": "project.tasks.record", "schedule": 4.0},
}
