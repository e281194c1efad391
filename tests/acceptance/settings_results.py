"""project.settings with django-celery-results storing each task's result in the database.

Its tables are not in the test database that pytest-django migrates from project.settings: the
test migrates them with this module (``manage.py migrate django_celery_results``) and unmigrates
them at its end.
"""

from project.settings import *
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_results"]
CELERY_RESULT_BACKEND = "django-db"
# Each result row with the task's name, arguments and the periodic task it came from.
CELERY_RESULT_EXTENDED = True
