"""project.settings with the deployment's queue bounded to one waiting message, refusing more.

Beat replicas and workers started with this settings module declare CELERY_TASK_DEFAULT_QUEUE
as ``tests.acceptance.refusing_queue`` defines it (RabbitMQ only).
"""

from project.settings import *
from project.settings import CELERY_TASK_DEFAULT_QUEUE
from tests.acceptance.refusing_queue import refusing_queue

CELERY_TASK_QUEUES = [refusing_queue(CELERY_TASK_DEFAULT_QUEUE)]
