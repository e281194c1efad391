"""Why the guard sits in ``before_start``: what Celery 5.7's tracer does with each hook."""

from __future__ import annotations

import pytest
from celery import Celery, signals
from celery.exceptions import Ignore

from scheduling import guard


@pytest.fixture
def app() -> Celery:
    app = Celery("hooks", set_as_current=False)
    app.conf.task_annotations = ["scheduling.guard:GuardAnnotation"]
    return app


def test_an_ignore_raised_by_a_prerun_receiver_does_not_skip_the_body(app):
    calls: list[str] = []

    @app.task(name="hooks.prerun", shared=False)
    def body() -> None:
        calls.append("body")

    def receiver(**_: object) -> None:
        raise Ignore("from task_prerun")

    signals.task_prerun.connect(receiver, weak=False)
    try:
        result = body.apply()
    finally:
        signals.task_prerun.disconnect(receiver)
    assert (calls, result.state) == (["body"], "SUCCESS")


def test_an_ignore_raised_by_before_start_skips_the_body_and_records_nothing(app):
    calls: list[str] = []

    class Dropping(app.Task):
        def before_start(self, task_id, args, kwargs):
            raise Ignore("duplicate")

    @app.task(base=Dropping, name="hooks.dropping", shared=False)
    def body() -> None:
        calls.append("body")

    succeeded: list[object] = []

    def on_success(sender: object = None, **_: object) -> None:
        succeeded.append(sender)

    signals.task_success.connect(on_success, weak=False)
    try:
        result = body.apply()
    finally:
        signals.task_success.disconnect(on_success)
    assert (calls, result.state, succeeded) == ([], "IGNORED", [])


def test_the_annotation_guards_every_task_and_keeps_its_own_before_start(app, monkeypatch):
    seen: list[str] = []

    class Custom(app.Task):
        def before_start(self, task_id, args, kwargs):
            seen.append(f"own {task_id}")

    @app.task(base=Custom, name="hooks.custom", shared=False)
    def custom() -> None: ...

    @app.task(name="hooks.plain", shared=False)
    def plain() -> None: ...

    assert guard.is_guarded(custom) and guard.is_guarded(plain)
    monkeypatch.setattr(guard, "guard", lambda request, task_id: seen.append(f"guard {task_id}"))

    custom.push_request(id="a", headers=None)  # not sent by the scheduler: no guard
    custom.before_start("a", (), {})
    custom.pop_request()
    custom.push_request(id="b", scheduling_run=7)
    custom.before_start("b", (), {})
    custom.pop_request()
    custom.push_request(id="c", scheduling_run=7, is_eager=True)  # eager calls are left alone
    custom.before_start("c", (), {})
    custom.pop_request()
    assert seen == ["own a", "guard b", "own b", "own c"]


def test_a_task_annotated_twice_runs_the_guard_once(app, monkeypatch):
    @app.task(name="hooks.twice", shared=False)
    def plain() -> None: ...

    type(app.tasks[plain.name]).annotate()  # a subclass re-annotated, or a second binding
    calls: list[str] = []
    monkeypatch.setattr(guard, "guard", lambda request, task_id: calls.append(task_id))
    plain.push_request(id="x", scheduling_run=1)
    plain.before_start("x", (), {})
    plain.pop_request()
    assert calls == ["x"]
