"""project.settings with OpenTelemetry's Celery instrumentation in beat and worker processes.

As OpenTelemetry's guide for Celery does it: tracing starts on ``worker_process_init`` in each
pool process and on ``beat_init`` in each beat replica (``tests.acceptance.span_log``).
"""

from celery.signals import beat_init, worker_process_init

from project.settings import *
from tests.acceptance.span_log import start_tracing

worker_process_init.connect(start_tracing, weak=False)
beat_init.connect(start_tracing, weak=False)
