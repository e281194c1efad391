"""Django settings of the django-periodic-tasks peer, as its README and django-tasks-db's set it up.

``INSTALLED_APPS`` has the two apps, ``TASKS`` the database backend (django-tasks-db) on the
database DATABASE_URL names (the benchmark's or the test's, beside this project's tables).
Everything else is the packages' defaults: the scheduler's re-dispatch lease (300 s), its dispatch
attempts (3). The scheduler's tick is its ``run_scheduler --interval`` (``bench.dpt_peer``).
"""

import os

import dj_database_url

SECRET_KEY = "bench-dpt"  # no secret: nothing is signed
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
# The admin and what it needs: a project as the README assumes one (the package's task choices
# scan every module, and a module that imported the admin touches its site).
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages",
    "django_periodic_tasks", "django_tasks_db", "bench.dpt",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
