"""project.settings with Sentry's SDK set up as Sentry's Django guide does it, Crons on.

``sentry_sdk.init`` in the settings module runs in every process that loads them: each beat
replica (its ``Scheduler.apply_entry`` sends the ``in_progress`` check-in) and each worker (its
``task_success``/``task_failure`` send ``ok``/``error``). The SDK reads the DSN from SENTRY_DSN.
"""

import sentry_sdk
from sentry_sdk.integrations.celery import CeleryIntegration

from project.settings import *

sentry_sdk.init(integrations=[CeleryIntegration(monitor_beat_tasks=True)])
