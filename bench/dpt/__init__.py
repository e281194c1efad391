"""The django-periodic-tasks peer's own Django project (settings, the recording task).

Imported only inside its virtualenv (``.venv-dpt``, made by ``bench.dpt_peer``): Django 6.0,
django-periodic-tasks and django-tasks-db, nothing of this project's.
"""
