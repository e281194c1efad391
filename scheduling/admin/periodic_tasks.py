"""The periodic task admin: its policy inline, recent runs, upcoming runs, pauses, edit history,
"Run now" and "Backfill" through the ledger."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext
from django_celery_beat.admin import PeriodicTaskAdmin as BasePeriodicTaskAdmin
from django_celery_beat.admin import PeriodicTaskForm as BasePeriodicTaskForm
from django_celery_beat.models import PeriodicTask

from scheduling import (
    history,
    ledger,
)
from scheduling.admin import task_tools, upcoming_runs
from scheduling.admin.base import (
    ADMIN_CSS,
    RECENT_PAUSES,
    RECENT_RUNS,
    RecordsActorAdmin,
    _cut,
    _seconds,
    _utc_ms,
)
from scheduling.admin.schedules import interval_error
from scheduling.admin.task_dates import TaskDatesAdmin
from scheduling.admin.task_forms import (
    BackfillForm,
    PauseForm,
    _early_slots,
    _range_key,
    _succeeded_slots,
)
from scheduling.admin_permissions import requiring
from scheduling.conf import conf
from scheduling.exceptions import PauseRejected, RunRejected, SchedulingError
from scheduling.models import Pause, Run, TaskPolicy
from scheduling.outcomes import status_badge
from scheduling.overview import Paused, describe_schedule, paused_of, with_status
from scheduling.run_message import load_json
from scheduling.timeformat import utc_text

#: The admin actions' log lines keep the logger they always had (docs/operating.md).
logger = logging.getLogger("scheduling.admin")


admin.site.unregister(PeriodicTask)


class TaskPolicyInline(admin.StackedInline):
    """Misfire and overlap policy of one periodic task (defaults when absent), its fields in the
    model's order (an overlap policy's parameters right after it)."""

    model = TaskPolicy
    can_delete = False
    max_num = 1
    extra = 0
    verbose_name = "scheduling policy"


class PeriodicTaskForm(BasePeriodicTaskForm):
    """django-celery-beat's form, refusing at input what would only fail the task's runs later.

    ``args`` must be a JSON list and ``kwargs`` and ``headers`` JSON objects (the rule of
    ``run_message.load_json``, with the same error text a run would get), and the Celery task name
    must be registered in this app (unless ``SCHEDULING_REJECT_UNKNOWN_TASKS`` is off), and an
    interval not shorter than a second (``schedules.interval_error``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Show a registered task name in the "Task (registered)" dropdown, not as a custom one:
        the saved task's, and the one a refused form brings back in "Task (custom)". The clocked
        dropdown shows its times in the one format (``utc_text``)."""
        super().__init__(*args, **kwargs)
        if "clocked" in self.fields:  # "2026-12-07 18:59:28 UTC", not the model's isoformat
            self.fields["clocked"].label_from_instance = lambda c: utc_text(c.clocked_time, "s")
        registered = {value for value, _ in self.fields["regtask"].widget.choices if value}
        if self.is_bound:
            name = self.data.get("task", "")
            if not self.data.get("regtask") and name in registered:
                self.data = self.data.copy()
                self.data["regtask"], self.data["task"] = name, ""
        elif self.instance.task in registered and not self.initial.get("regtask"):
            self.initial["regtask"], self.initial["task"] = self.instance.task, ""

    def _json(self, field: str) -> str:
        value = self.cleaned_data[field]
        try:
            load_json(value, field)
        except RunRejected as exc:
            raise forms.ValidationError(str(exc)) from exc
        return value

    def clean_args(self) -> str:
        return self._json("args")

    def clean_kwargs(self) -> str:
        return self._json("kwargs")

    def clean_headers(self) -> str:
        return self._json("headers")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        name = data.get("task")
        app = PeriodicTaskAdmin.celery_app
        app.loader.import_default_modules()  # the project's tasks, as a beat replica sees them
        if name and conf.reject_unknown_tasks and name not in app.tasks:
            self.add_error("task", f"unknown task name {name!r}: not registered in this app")
        interval = data.get("interval")
        if interval is not None and (error := interval_error(interval.every, interval.period)):
            self.add_error("interval", error)
        return data


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(
    RecordsActorAdmin, task_tools.TaskToolsAdmin, TaskDatesAdmin, upcoming_runs.UpcomingRunsAdmin,
    BasePeriodicTaskAdmin,
):
    """django-celery-beat's periodic task admin: recent and upcoming runs, pauses, its edit
    history, run now and backfill via the ledger (pause, resume and run now on its page too)."""

    form = PeriodicTaskForm
    inlines = [TaskPolicyInline]
    #: django-celery-beat's, with nothing under an empty crontab field ("Translation: undefined").
    change_form_template = "admin/scheduling/periodic_task_form.html"

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    actions = (*BasePeriodicTaskAdmin.actions, "backfill_tasks", "pause_tasks", "resume_tasks")
    # django-celery-beat declares these without permissions: Django would offer them to every
    # user who can view the list.
    enable_tasks = requiring(BasePeriodicTaskAdmin.enable_tasks, "change")
    disable_tasks = requiring(BasePeriodicTaskAdmin.disable_tasks, "change")
    toggle_tasks = requiring(BasePeriodicTaskAdmin.toggle_tasks, "change")
    # Fits 1,280 px with the sidebar open; the status columns are subqueries of the page's one
    # query (``overview.with_status``).
    list_display = (
        "name", "display_schedule", "display_state", "display_next_run", "display_last_outcome",
        "display_runs",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[PeriodicTask]:
        return with_status(super().get_queryset(request))

    @admin.display(description="schedule")
    def display_schedule(self, task: PeriodicTask) -> str:
        return describe_schedule(task)

    @admin.display(description="state", ordering="enabled")
    def display_state(self, task: PeriodicTask) -> str:
        """enabled, disabled, or paused (since, by and why in the title)."""
        paused = paused_of(task)
        if paused is not None:
            return format_html(
                '<span class="task-state task-paused" title="{}">paused</span>', paused.describe()
            )
        state = "enabled" if task.enabled else "disabled"
        return format_html('<span class="task-state task-{}">{}</span>', state, state)

    @admin.display(description="next run (UTC)", ordering="next_run")
    def display_next_run(self, task: PeriodicTask) -> str:
        """The earliest pending run's slot; none while paused or disabled."""
        if task.paused_at is not None or task.next_run is None or not task.enabled:
            return "-"
        return utc_text(task.next_run, "s")

    @admin.display(description="last outcome (UTC)", ordering="last_run")
    def display_last_outcome(self, task: PeriodicTask) -> str:
        """The newest finished-or-running run's status badge and its slot."""
        if task.last_status is None:
            return "-"
        return format_html(
            '{} <span class="quiet">{}</span>', status_badge(task.last_status),
            utc_text(task.last_run, "s"),
        )

    @admin.display(description="runs")
    def display_runs(self, task: PeriodicTask) -> str:
        query = urlencode({"periodic_task__id__exact": task.pk})
        return format_html(
            '<a href="{}?{}">runs</a>', reverse("admin:scheduling_run_changelist"), query
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return (
            *super().get_readonly_fields(request, obj), "upcoming_runs", "recent_runs",
            "pause_state", "edit_history",
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        fieldsets.append(("Upcoming runs", {"fields": ("upcoming_runs",)}))
        if obj is not None:
            fieldsets.insert(0, ("Pause", {"fields": ("pause_state",)}))
            fieldsets.append(("Recent runs", {"fields": ("recent_runs",)}))
            fieldsets.append(("Edit history", {"fields": ("edit_history",)}))
        return fieldsets

    def saved_task(self, obj: PeriodicTask) -> PeriodicTask:
        return obj

    def paused(self, obj: PeriodicTask) -> str:
        current = Pause.objects.open().filter(periodic_task=obj).first()
        return "" if current is None else Paused(
            current.paused_at, current.paused_by, current.why
        ).describe()

    def edited_task(self, form: forms.ModelForm, now: datetime) -> PeriodicTask:
        """The form's schedule fields only: the task name, say, may still be missing."""
        upcoming_runs.form_errors(
            form, (*upcoming_runs.SCHEDULE_FIELDS, *upcoming_runs.SLOT_FIELDS)
        )
        return upcoming_runs.candidate(form.cleaned_data, now)

    @admin.display(description="pause")
    def pause_state(self, obj: PeriodicTask) -> str:
        """Whether the task is paused, since when, by whom and why; then its last pauses."""
        pauses = list(Pause.objects.filter(periodic_task=obj)[:RECENT_PAUSES])
        current = next((p for p in pauses if p.resumed_at is None), None)
        if current is None:
            state = mark_safe("<strong>Not paused.</strong>")
        else:
            state = format_html(
                '<strong class="scheduling-paused">Paused since {} by {}</strong>: {}',
                _utc_ms(current.paused_at), current.paused_by, current.why or "(no reason given)",
            )
        ended = [p for p in pauses if p.resumed_at is not None]
        if not ended:
            return state
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _utc_ms(p.paused_at), p.paused_by, p.why, _utc_ms(p.resumed_at),
                    p.resumed_by, p.run.slots if p.run is not None else 0,
                )
                for p in ended
            ),
        )
        return format_html(
            "{}<table><thead><tr><th>paused (UTC)</th><th>by</th><th>why</th>"
            "<th>resumed (UTC)</th><th>by</th><th>slots skipped</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            state, rows,
        )

    @admin.display(description="edit history")
    def edit_history(self, obj: PeriodicTask) -> str:
        return history.render_history(obj.pk)

    @admin.display(description="recent runs")
    def recent_runs(self, obj: PeriodicTask) -> str:
        runs = Run.objects.filter(periodic_task=obj).order_by("-scheduled_for", "-id")[:RECENT_RUNS]
        if not runs:
            return "No runs yet."
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{} · {}</td><td>{}</td><td>{}</td><td>{}</td>'
            '<td class="reason">{}</td>'
            "</tr>",
            (
                (
                    _utc_ms(run.scheduled_for),
                    run.trigger,
                    _version_link(run),
                    status_badge(run.status),
                    _seconds(run.lateness),
                    _cut(run.claimed_by),
                    run.error or run.reason or "",
                )
                for run in runs
            ),
        )
        return format_html(
            '<table class="recent-runs"><thead><tr><th>scheduled for (UTC)</th>'
            '<th title="the definition version that planned the run">trigger · version</th>'
            "<th>status</th><th>lateness</th><th>replica</th><th>reason / error</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    @admin.action(
        description="Run selected tasks now (once, through the ledger)", permissions=["change"]
    )
    def run_tasks(
        self, request: HttpRequest, queryset: QuerySet[PeriodicTask]
    ) -> TemplateResponse | None:
        """Replace django-celery-beat's direct send: create one manual run per task.

        A disabled or finished task (``ledger.run_now_refusal``) is run only once the user
        confirmed it on a page that names why it would not run on its own.
        """
        now = ledger.database_now()
        tasks = list(queryset)
        refused = [(task, why) for task in tasks if (why := ledger.run_now_refusal(task, now))]
        if refused and "confirm" not in request.POST:
            return self._action_page(
                request, "run_now_confirm.html",
                ngettext("Run a disabled or finished task now?",
                         "Run disabled or finished tasks now?", len(tasks)),
                refused=refused, tasks=tasks,
            )
        who = request.user.get_username()
        for task in tasks:
            ledger.request_run(task, requested_by=who, force=True)
        logger.info(
            "%d manual run(s) requested by %s in the admin: %s", len(tasks), who,
            ", ".join(repr(task.name) for task in tasks), extra={"action": "run_now"},
        )
        self.message_user(
            request,
            ngettext(
                "%(count)d manual run queued; a beat replica dispatches it exactly once.",
                "%(count)d manual runs queued; a beat replica dispatches each exactly once.",
                len(tasks),
            ) % {"count": len(tasks)},
            messages.SUCCESS,
        )
        return None

    def _action_page(
        self, request: HttpRequest, template: str, title: str, **context: Any
    ) -> TemplateResponse:
        """An action's intermediate page (``admin/scheduling/<template>``) in the admin's frame."""
        context = {
            **self.admin_site.each_context(request), "title": title, "opts": self.model._meta,
            **context,
        }
        return TemplateResponse(request, f"admin/scheduling/{template}", context)

    @admin.action(description="Backfill selected tasks over a past range", permissions=["change"])
    def backfill_tasks(
        self, request: HttpRequest, queryset: QuerySet[PeriodicTask]
    ) -> TemplateResponse | None:
        """Ask for a range (a form page), then create the backfill runs through the ledger.

        The form page comes back, with what was entered, on every error: a bad or future range,
        a task whose backfill failed (the others' runs are created and reported). When slots of
        the range already succeeded on schedule and have no backfill run (the slots a backfill
        runs again), or come before a task was created, it says how many and asks once more.
        """
        form = BackfillForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._backfill_page(request, form, queryset)
        since, until = form.cleaned_data["since"], form.cleaned_data["until"]
        succeeded = _succeeded_slots(queryset, since, until)
        early = _early_slots(queryset, since, until)
        confirmed = request.POST.get("confirm") == _range_key(since, until)
        if (succeeded or early) and not confirmed:  # asked again when the range changed
            return self._backfill_page(request, form, queryset, succeeded, early)
        who = request.user.get_username()
        for task in queryset:
            # The admin capitalises a message's first letter: the task's name comes after it.
            try:
                total = ledger.backfill(task, since, until, requested_by=who)
            except SchedulingError as exc:
                form.add_error(None, f"Backfill of {task.name!r}: {exc}")
                continue
            logger.info(
                "backfill of %r %s..%s requested by %s in the admin: %d slots, %d new runs",
                task.name, since.isoformat(), until.isoformat(), who, total.slots, total.created,
                extra={"action": "backfill"},
            )
            if not total.slots:
                reason = ledger.no_slot_reason(task, since, until)
                self.message_user(request, f"Backfill of {task.name!r}: {reason}.", messages.WARNING)
                continue
            self.message_user(
                request,
                f"Backfill of {task.name!r}: {total.slots} slots, {total.created} new backfill "
                f"runs ({total.slots - total.created} already there).",
                messages.SUCCESS,
            )
        return self._backfill_page(request, form, queryset) if form.errors else None

    def _backfill_page(
        self, request: HttpRequest, form: BackfillForm, queryset: QuerySet[PeriodicTask],
        succeeded: dict[str, int] | None = None, early: list[tuple[str, int, str]] | None = None,
    ) -> TemplateResponse:
        return self._action_page(
            request, "backfill.html", "Backfill periodic tasks", form=form, queryset=queryset,
            succeeded=sorted((succeeded or {}).items()),
            succeeded_total=sum((succeeded or {}).values()),
            early=early or [], early_total=sum(count for _, count, _ in early or []),
            confirm=_range_key(form.cleaned_data["since"], form.cleaned_data["until"])
            if succeeded or early else "",
        )

    @admin.action(description="Pause selected tasks (with a reason)", permissions=["change"])
    def pause_tasks(
        self, request: HttpRequest, queryset: QuerySet[PeriodicTask]
    ) -> TemplateResponse | None:
        """Ask why (a form page), then pause each task through the ledger."""
        form = PauseForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._action_page(
                request, "pause.html", "Pause periodic tasks", form=form, queryset=queryset
            )
        who = request.user.get_username()
        for task in queryset:
            try:
                ledger.pause(task, by=who, why=form.cleaned_data["why"])
            except PauseRejected as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            logger.info(
                "paused %r by %s in the admin: %s", task.name, who, form.cleaned_data["why"],
                extra={"action": "pause"},
            )
            self.message_user(request, f"Paused {task.name}.", messages.SUCCESS)
        return None

    @admin.action(description="Resume selected paused tasks", permissions=["change"])
    def resume_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        """Resume each paused task through the ledger: its next run is the first slot after now."""
        who = request.user.get_username()
        for task in queryset:
            try:
                done = ledger.resume(task, by=who)
            except PauseRejected as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            skipped = done.run.slots if done.run is not None else 0
            logger.info(
                "resumed %r by %s in the admin: %d slots skipped while paused", task.name, who,
                skipped, extra={"action": "resume"},
            )
            self.message_user(
                request,
                ngettext(
                    "Resumed %(task)s: %(count)d slot skipped while paused.",
                    "Resumed %(task)s: %(count)d slots skipped while paused.",
                    skipped,
                ) % {"task": task.name, "count": skipped},
                messages.SUCCESS,
            )


def _version_link(run: Run) -> str:
    """A run's definition version linked to its entry in the edit history on the same page."""
    if run.definition_version is None:
        return "-"
    return format_html('<a href="#history-v{}">{}</a>', run.definition_version,
                       run.definition_version)
