"""System check scheduling.W004: the Celery app's ``task_annotations`` do not install the worker
guard. Each form Celery accepts is recognised, and each one the check accepts really guards a
task of a Celery app configured with it."""

from __future__ import annotations

import pytest
from celery import Celery

from scheduling import guard
from scheduling.checks import check_guard_annotation

WRAPPER = guard.GuardAnnotation.annotate_any()["@before_start"]

#: Every form of ``task_annotations`` that installs the guard.
GUARDED = {
    "string": "scheduling.guard:GuardAnnotation",
    "dotted string": "scheduling.guard.GuardAnnotation",
    "list": ["scheduling.guard:GuardAnnotation"],
    "tuple among others": ({"other.task": {"rate_limit": "1/s"}}, "scheduling.guard:GuardAnnotation"),
    "dict": {"*": {"@before_start": WRAPPER}},
    "the class": guard.GuardAnnotation,
    "an instance": guard.GuardAnnotation(),
    "a list of the class": [guard.GuardAnnotation],
}

#: Forms that leave every task unguarded.
UNGUARDED = {
    "unset": None,
    "empty list": [],
    "another annotation": ["celery.app.annotations:MapAnnotation"],
    "a dict for one task": {"project.tasks.digest": {"@before_start": WRAPPER}},
    "a dict without the guard": {"*": {"rate_limit": "10/s"}},
}

MESSAGE = (
    "The Celery app's task_annotations do not include scheduling.guard:GuardAnnotation: "
    "workers write run rows but run each delivery without the at-most-once guard."
)
HINT = (
    "Add this line to your settings (or the string to your list): "
    'CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]'
)


@pytest.fixture
def configured(monkeypatch, settings):
    """Make a fresh Celery app with the given annotations the current one, the Django setting
    the same (as for an app configured from the Django settings); restore both afterwards."""
    def configure(annotations: object) -> Celery:
        app = Celery("guard-check", set_as_current=False)
        app.conf.task_annotations = annotations
        monkeypatch.setattr("scheduling.checks.current_app", app)
        settings.CELERY_TASK_ANNOTATIONS = annotations
        return app
    return configure


@pytest.mark.parametrize("annotations", GUARDED.values(), ids=GUARDED.keys())
def test_no_warning_for_each_form_that_installs_the_guard(configured, annotations):
    app = configured(annotations)

    @app.task(name="guard_check.body", shared=False)
    def body() -> None: ...

    assert guard.is_guarded(body)
    assert check_guard_annotation() == []


@pytest.mark.parametrize("annotations", UNGUARDED.values(), ids=UNGUARDED.keys())
def test_a_warning_with_the_line_to_add_for_each_form_without_it(configured, annotations):
    app = configured(annotations)

    @app.task(name="project.tasks.other", shared=False)
    def body() -> None: ...

    assert not guard.is_guarded(body)
    found = [(m.id, m.obj, m.msg, m.hint) for m in check_guard_annotation()]
    assert found == [("scheduling.W004", "CELERY_TASK_ANNOTATIONS", MESSAGE, HINT)]


def test_the_example_project_installs_the_guard_through_its_settings():
    from project.celery import app

    assert app.conf.task_annotations == ["scheduling.guard:GuardAnnotation"]
    assert check_guard_annotation() == []


def test_a_process_without_the_projects_celery_app_reads_the_django_setting(monkeypatch, settings):
    """``manage.py check`` where no Celery app is configured (Celery's fallback app has no
    annotations): the Django setting decides."""
    monkeypatch.setattr("scheduling.checks.current_app", Celery("fallback", set_as_current=False))
    settings.CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]
    assert check_guard_annotation() == []
    del settings.CELERY_TASK_ANNOTATIONS
    assert [m.id for m in check_guard_annotation()] == ["scheduling.W004"]


def test_an_app_configured_in_code_counts_without_the_django_setting(configured, settings):
    configured(["scheduling.guard:GuardAnnotation"])
    del settings.CELERY_TASK_ANNOTATIONS
    assert check_guard_annotation() == []
