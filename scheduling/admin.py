"""Admin: the run ledger as a read-only audit view; "Run now" and "Backfill" through the ledger."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, QuerySet
from django.http import HttpRequest, QueryDict
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django_celery_beat.admin import ClockedScheduleAdmin as BaseClockedScheduleAdmin
from django_celery_beat.admin import CrontabScheduleAdmin as BaseCrontabScheduleAdmin
from django_celery_beat.admin import IntervalScheduleAdmin as BaseIntervalScheduleAdmin
from django_celery_beat.admin import PeriodicTaskAdmin as BasePeriodicTaskAdmin
from django_celery_beat.admin import PeriodicTaskForm as BasePeriodicTaskForm
from django_celery_beat.admin import SolarScheduleAdmin as BaseSolarScheduleAdmin
from django_celery_beat.models import (
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
    SolarSchedule,
)

from scheduling import (
    health,
    history,
    ledger,
    preview,
    replicas,
    run_story,
    slots,
    timeline,
    windows,
)
from scheduling.admin_permissions import DeclaredPermissionsAdmin, read_only, requiring
from scheduling.clock import database_now
from scheduling.conf import conf
from scheduling.exceptions import PauseRejected, RunRejected, ScheduleError, SchedulingError
from scheduling.messages import load_json
from scheduling.models import Pause, Replica, Run, ScheduleHealth, TaskHistory, TaskPolicy
from scheduling.outcomes import OUTCOMES, status_badge
from scheduling.overview import Paused, describe_schedule, paused_of, with_status

RECENT_RUNS = 10
RECENT_PAUSES = 5
#: Status badges, the runs list and the schedule health page (fit 1,280 px, sidebar open).
ADMIN_CSS = "scheduling/admin.css"

logger = logging.getLogger(__name__)


def _seconds(delta: timedelta | None) -> str:
    return "-" if delta is None else f"{delta.total_seconds():.3f} s"


def _cut(text: str, kind: str = "replica") -> str:
    """A replica or worker id on one line, cut with an ellipsis; the whole id in the title."""
    return format_html(
        '<span class="run-cut {}" title="{}">{}</span>', kind, text or "-", text or "-"
    )


def _utc_ms(moment: datetime) -> str:
    """An aware datetime as UTC to the millisecond: ``2026-11-30 05:40:44.218``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class ReadOnlyAdmin(DeclaredPermissionsAdmin):
    """An audit view: nothing can be added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RecordsActorAdmin(DeclaredPermissionsAdmin):
    """Edits made on these pages are recorded in the edit history as made by the admin user.

    Each view that can write (the change form with its inlines, deletion, the list's actions and
    list edits) runs in one transaction that first names the user for the history's triggers
    (``ledger.acting``: the transaction-local setting ``scheduling.actor``).
    """

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with ledger.acting(_actor(request)):
            return super().changeform_view(request, *args, **kwargs)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with ledger.acting(_actor(request)):
            return super().delete_view(request, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if request.method != "POST":
            return super().changelist_view(request, *args, **kwargs)
        with ledger.acting(_actor(request)):
            return super().changelist_view(request, *args, **kwargs)


def _actor(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else ""


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    """The ledger: every run, its outcome and timings; nothing can be added, changed, deleted."""

    # Eight columns fit 1,280 px with the sidebar open: the status a badge, replica and worker
    # ids cut with an ellipsis (whole in the title), slots, executions and suppressed in one.
    list_display = (
        "periodic_task_name",
        "display_scheduled_for",
        "trigger",
        "display_status",
        "display_lateness",
        "display_replica",
        "display_runtime",
        "display_counts",
    )
    list_filter = ("status", "trigger", "periodic_task_name", "claimed_by")
    date_hierarchy = "scheduled_for"
    search_fields = (
        "periodic_task_name", "task", "task_id", "reason", "error", "worker", "claimed_by"
    )
    list_select_related = False
    ordering = ("-scheduled_for", "-id")
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names = [field.name for field in Run._meta.fields]
        names[names.index("definition_version")] = "display_definition_version"
        return ["display_story", *names]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The story (timeline and figures) first, then every column of the row as stored."""
        raw = self.get_readonly_fields(request, obj)[1:]
        return [("Story", {"fields": ["display_story"]}), ("Raw fields", {"fields": raw})]

    @admin.display(description="timeline")
    def display_story(self, run: Run) -> str:
        """What happened to the run, in order, to the millisecond (``run_story``)."""
        told = run_story.story(run)
        rows = [
            {"what": m.what, "utc": m.utc(), "local": m.local(told.zone), "detail": m.detail}
            for m in told.moments
        ]
        return render_to_string("admin/scheduling/run_story.html", {
            "run": run, "story": told, "rows": rows, "zone": str(told.zone),
            "badge": status_badge(run.status), "lateness": _seconds(told.lateness),
            "runtime": _seconds(told.runtime),
        })

    @admin.display(description="definition version")
    def display_definition_version(self, run: Run) -> str:
        """The version its task's definition had when this run was planned, linked to the change."""
        entry = history.entry_for(run)
        if entry is None:
            return "-" if run.definition_version is None else str(run.definition_version)
        return format_html(
            '<a href="{}">version {}</a>: {} {} by {} at {} UTC',
            history.entry_url(entry), entry.version, entry.kind, entry.operation,
            history.who(entry), _utc_ms(entry.changed_at),
        )

    @admin.display(description="scheduled for (UTC)", ordering="scheduled_for")
    def display_scheduled_for(self, run: Run) -> str:
        return _utc_ms(run.scheduled_for)

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    @admin.display(description="status", ordering="status")
    def display_status(self, run: Run) -> str:
        return status_badge(run.status)

    @admin.display(description="lateness")
    def display_lateness(self, run: Run) -> str:
        return _seconds(run.lateness)

    @admin.display(description="replica · worker", ordering="claimed_by")
    def display_replica(self, run: Run) -> str:
        worker = _cut(run.worker, "worker") if run.worker else ""
        return format_html("{}{}", _cut(run.claimed_by), worker)

    @admin.display(description="slots · exec. · suppr.")
    def display_counts(self, run: Run) -> str:
        return format_html(
            '<span title="slots {} · executions {} · suppressed duplicates {}">{} · {} · {}</span>',
            run.slots, run.executions, run.suppressed, run.slots, run.executions, run.suppressed,
        )

    @admin.display(description="runtime")
    def display_runtime(self, run: Run) -> str:
        return _seconds(run.runtime)


admin.site.unregister(PeriodicTask)


class TaskPolicyInline(admin.StackedInline):
    """Misfire and overlap policy of one periodic task (defaults when absent)."""

    model = TaskPolicy
    can_delete = False
    max_num = 1
    extra = 0
    verbose_name = "scheduling policy"


class PeriodicTaskForm(BasePeriodicTaskForm):
    """django-celery-beat's form, refusing at input what would only fail the task's runs later.

    ``args`` must be a JSON list and ``kwargs`` and ``headers`` JSON objects (the rule of
    ``messages.load_json``, with the same error text a run would get), and the Celery task name
    must be registered in this app (unless ``SCHEDULING_REJECT_UNKNOWN_TASKS`` is off).
    """

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
        return data


@admin.register(PeriodicTask)
class PeriodicTaskAdmin(RecordsActorAdmin, preview.UpcomingRunsAdmin, BasePeriodicTaskAdmin):
    """django-celery-beat's periodic task admin: recent and upcoming runs, pauses, its edit
    history, run now and backfill via the ledger."""

    form = PeriodicTaskForm
    inlines = [TaskPolicyInline]

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    actions = (*BasePeriodicTaskAdmin.actions, "backfill_tasks", "pause_tasks", "resume_tasks")
    # django-celery-beat declares these without permissions: Django would offer them to every
    # user who can view the list (issue 32).
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
        return f"{task.next_run.astimezone(UTC):%Y-%m-%d %H:%M:%S}"

    @admin.display(description="last outcome (UTC)", ordering="last_run")
    def display_last_outcome(self, task: PeriodicTask) -> str:
        """The newest finished-or-running run's status badge and its slot."""
        if task.last_status is None:
            return "-"
        return format_html(
            '{} <span class="quiet">{}</span>', status_badge(task.last_status),
            f"{task.last_run.astimezone(UTC):%Y-%m-%d %H:%M:%S}",
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
        preview.form_errors(form, (*preview.SCHEDULE_FIELDS, *preview.SLOT_FIELDS))
        return preview.candidate(form.cleaned_data, now)

    @admin.display(description="pause")
    def pause_state(self, obj: PeriodicTask) -> str:
        """Whether the task is paused, since when, by whom and why; then its last pauses."""
        pauses = list(Pause.objects.filter(periodic_task=obj)[:RECENT_PAUSES])
        current = next((p for p in pauses if p.resumed_at is None), None)
        if current is None:
            state = mark_safe("<strong>Not paused.</strong>")
        else:
            state = format_html(
                '<strong class="scheduling-paused">Paused since {} UTC by {}</strong>: {}',
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
                request, "run_now_confirm.html", "Run disabled or finished tasks now?",
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
            f"{len(tasks)} manual run(s) queued; a beat replica dispatches each exactly once.",
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
        the range already succeeded, it says how many and asks once more before running them
        again.
        """
        form = BackfillForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._backfill_page(request, form, queryset)
        since, until = form.cleaned_data["since"], form.cleaned_data["until"]
        succeeded = _succeeded_slots(queryset, since, until)
        confirmed = request.POST.get("confirm") == _range_key(since, until)
        if succeeded and not confirmed:  # asked again when the range changed
            return self._backfill_page(request, form, queryset, succeeded=succeeded)
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
            self.message_user(
                request,
                f"Backfill of {task.name!r}: {total.slots} slots, {total.created} new backfill "
                f"runs ({total.slots - total.created} already there).",
                messages.SUCCESS,
            )
        return self._backfill_page(request, form, queryset) if form.errors else None

    def _backfill_page(
        self, request: HttpRequest, form: BackfillForm, queryset: QuerySet[PeriodicTask],
        succeeded: dict[str, int] | None = None,
    ) -> TemplateResponse:
        return self._action_page(
            request, "backfill.html", "Backfill periodic tasks", form=form, queryset=queryset,
            succeeded=sorted((succeeded or {}).items()),
            succeeded_total=sum((succeeded or {}).values()),
            confirm=_range_key(form.cleaned_data["since"], form.cleaned_data["until"])
            if succeeded else "",
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
            self.message_user(
                request, f"Resumed {task.name}: {skipped} slots skipped while paused.",
                messages.SUCCESS,
            )


class PauseForm(forms.Form):
    """Why the selected tasks are paused (kept on the pause and on its skipped run)."""

    why = forms.CharField(
        label="Reason", max_length=500, widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Shown on the task's page and in the ledger.",
    )


def _version_link(run: Run) -> str:
    """A run's definition version linked to its entry in the edit history on the same page."""
    if run.definition_version is None:
        return "-"
    return format_html('<a href="#history-v{}">{}</a>', run.definition_version,
                       run.definition_version)


class BackfillForm(forms.Form):
    """The past range of a backfill, in UTC: [since, until), until not after the database clock."""

    since = forms.DateTimeField(help_text="UTC, e.g. 2026-01-05 10:00:00")
    until = forms.DateTimeField(help_text="UTC, excluded; not in the future")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since is not None and until is not None and until <= since:
            self.add_error("until", "until must be after since.")
        elif until is not None and until > (now := database_now()):
            self.add_error(
                "until", f"until is in the future: the database clock is {_utc_ms(now)} UTC."
            )
        return data


def _range_key(since: datetime, until: datetime) -> str:
    """The range a confirmation of a backfill over succeeded slots was given for."""
    return f"{since.isoformat()}/{until.isoformat()}"


def _succeeded_slots(
    tasks: QuerySet[PeriodicTask], since: datetime, until: datetime
) -> dict[str, int]:
    """Per task name, the slots in [since, until) that already have a succeeded run (any
    trigger): a backfill runs them again. Tasks with none are left out. One query."""
    counts = (
        Run.objects.filter(
            periodic_task__in=tasks, status=Run.Status.SUCCEEDED,
            scheduled_for__gte=since, scheduled_for__lt=until,
        )
        .values("periodic_task__name")
        .annotate(slots=Count("scheduled_for", distinct=True))
    )
    return {row["periodic_task__name"]: row["slots"] for row in counts}


#: A replica's state as a badge: (background, text colour).
REPLICA_COLOURS = {
    "live": ("#d7efd8", "#1b4d1e"), "stale": ("#fde3c0", "#6b3a00"),
    "stopped": ("#e4e7ea", "#33393f"),
}


@admin.register(Replica)
class ReplicaAdmin(ReadOnlyAdmin):
    """Beat replicas as their heartbeats report them (display only); stale ones flagged."""

    list_display = (
        "id", "host", "pid", "display_started", "display_last_tick", "runs_claimed",
        "display_state",
    )
    search_fields = ("id", "host")

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}
    # Running replicas first (stale ones sink below live ones), then the stopped ones.
    ordering = (F("stopped_at").desc(nulls_first=True), "-last_tick_at", "id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Replica]:
        return replicas.with_state(super().get_queryset(request))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        extra = {
            "title": "Beat replicas",
            "heartbeat_interval": conf.heartbeat_interval,
            "stale_after": replicas.stale_after().total_seconds(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    @admin.display(description="started (UTC)", ordering="started_at")
    def display_started(self, replica: Replica) -> str:
        return f"{replica.started_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="last tick (UTC)", ordering="-last_tick_at")
    def display_last_tick(self, replica: Any) -> str:
        return format_html(
            "{} <span class=\"quiet\">({} s ago)</span>",
            f"{replica.last_tick_at:%Y-%m-%d %H:%M:%S}", f"{replica.tick_age:.0f}",
        )

    @admin.display(description="state")
    def display_state(self, replica: Any) -> str:
        icon = {"live": "icon-yes.svg", "stale": "icon-alert.svg", "stopped": "icon-no.svg"}
        text = {
            "live": "live",
            "stale": f"stale: no tick for {replica.tick_age:.0f} s",
            "stopped": f"stopped {replica.stopped_at:%Y-%m-%d %H:%M:%S}" if replica.stopped_at
            else "stopped",
        }
        return format_html(
            '<span class="replica-state replica-{} run-badge" style="background:{};color:{}">'
            '<img src="{}" alt="{}"> {}</span>',
            replica.state, *REPLICA_COLOURS[replica.state],
            static(f"admin/img/{icon[replica.state]}"), replica.state, text[replica.state],
        )


class HealthWindowForm(forms.Form):
    """The schedule health page's window: a preset (``windows.PRESETS``) or [since, until)."""

    window = forms.ChoiceField(
        choices=[(key, label) for key, (_span, label, _last) in windows.PRESETS.items()],
        required=False,
    )
    since = forms.DateTimeField(required=False, help_text="UTC, e.g. 2026-01-05 10:00")
    until = forms.DateTimeField(required=False, help_text="UTC, excluded")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        given = [name for name in ("since", "until") if str(self.data.get(name, "")).strip()]
        if len(given) == 1:  # a value given but not valid has its own field error
            raise forms.ValidationError(
                f"A custom range needs both since and until: {given[0]} was given alone."
            )
        if since is not None and until is not None and until <= since:
            raise forms.ValidationError("until must be after since.")
        return data

    def chosen(self, now: datetime) -> windows.Window:
        """The window asked for; the default preset when the form is invalid or empty."""
        data = self.cleaned_data if self.is_valid() else {}
        if data.get("since") is not None:
            return windows.custom(data["since"], data["until"])
        return windows.preset(data.get("window") or windows.DEFAULT, now)


@admin.register(ScheduleHealth)
class ScheduleHealthAdmin(ReadOnlyAdmin):
    """The schedule health page: runs per periodic task over a window (view on runs)."""

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(read_only(self.changelist_view))
        return [path("", view, name="scheduling_schedulehealth_changelist")]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("scheduling.view_run")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = HealthWindowForm(request.GET)
        window = form.chosen(database_now())
        query = QueryDict(mutable=True)
        if window.key == "custom":
            query.update({"since": request.GET["since"], "until": request.GET["until"]})
        else:
            query["window"] = window.key
        context = {
            **self.admin_site.each_context(request),
            "title": f"Schedule health: {window.label}",
            "opts": self.model._meta,
            "form": form,
            "timeline": timeline.build(window, request.GET.get("p")),
            "presets": [(key, label) for key, (_span, label, _last) in windows.PRESETS.items()],
            "window_query": query.urlencode(),
            "outcomes": OUTCOMES,
            "chart_width": timeline.CHART_WIDTH,
            "overdue": health.overdue_tasks(health.CLOSED_WINDOW.total_seconds()),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/scheduling/schedule_health.html", context)


class CrontabScheduleForm(forms.ModelForm):
    """A crontab that never fires (day 31 of February, say) is refused at input."""

    class Meta:
        model = CrontabSchedule
        fields = preview.CRONTAB_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if all(data.get(field) not in (None, "") for field in preview.CRONTAB_FIELDS):
            candidate = CrontabSchedule(**{field: data[field] for field in preview.CRONTAB_FIELDS})
            try:
                slots.next_crontab(candidate, timezone.now())
            except ScheduleError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return data


admin.site.unregister(CrontabSchedule)


@admin.register(CrontabSchedule)
class CrontabScheduleAdmin(
    RecordsActorAdmin, preview.UpcomingRunsAdmin, BaseCrontabScheduleAdmin
):
    """django-celery-beat's crontab admin with ``CrontabScheduleForm`` and upcoming runs; edits
    name their user in the edit history."""

    form = CrontabScheduleForm
    fields = (*BaseCrontabScheduleAdmin.fields, "upcoming_runs")
    readonly_fields = (*BaseCrontabScheduleAdmin.readonly_fields, "upcoming_runs")

    def saved_task(self, obj: CrontabSchedule) -> PeriodicTask:
        return preview.crontab_task(obj, ledger.database_now())

    def edited_task(self, form: forms.ModelForm, now: datetime) -> PeriodicTask:
        """The crontab as edited, for a task without a start time that uses it."""
        preview.form_errors(form, preview.CRONTAB_FIELDS, non_field=True)
        data = form.cleaned_data
        return preview.crontab_task(
            CrontabSchedule(**{name: data[name] for name in preview.CRONTAB_FIELDS}), now
        )


admin.site.unregister(IntervalSchedule)
admin.site.unregister(SolarSchedule)
admin.site.unregister(ClockedSchedule)


@admin.register(IntervalSchedule)
class IntervalScheduleAdmin(RecordsActorAdmin, BaseIntervalScheduleAdmin):
    """django-celery-beat's interval admin; edits name their user in the edit history."""


@admin.register(SolarSchedule)
class SolarScheduleAdmin(RecordsActorAdmin, BaseSolarScheduleAdmin):
    """django-celery-beat's solar admin; edits name their user in the edit history."""


@admin.register(ClockedSchedule)
class ClockedScheduleAdmin(RecordsActorAdmin, BaseClockedScheduleAdmin):
    """django-celery-beat's clocked admin; edits name their user in the edit history."""


@admin.register(TaskHistory)
class TaskHistoryAdmin(ReadOnlyAdmin):
    """The edit history: every change of a periodic task, its schedule row or its policy.

    Written by database triggers, whoever made the change (admin, ORM, raw SQL); read only.
    """

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": (ADMIN_CSS,)}

    list_display = (
        "periodic_task_name", "version", "display_changed_at", "display_who", "kind",
        "object_id", "operation", "display_changes",
    )
    list_filter = ("kind", "operation", "periodic_task_name")
    search_fields = ("periodic_task_name", "actor", "role")
    date_hierarchy = "changed_at"
    ordering = ("-changed_at", "-id")
    show_full_result_count = False
    readonly_fields = (
        "periodic_task_name", "display_task", "version", "display_changed_at", "display_who",
        "kind", "object_id", "operation", "display_changes", "display_runs",
    )
    fields = readonly_fields

    @admin.display(description="changed at (UTC)", ordering="changed_at")
    def display_changed_at(self, entry: TaskHistory) -> str:
        return _utc_ms(entry.changed_at)

    @admin.display(description="by")
    def display_who(self, entry: TaskHistory) -> str:
        return history.who(entry)

    @admin.display(description="before → after")
    def display_changes(self, entry: TaskHistory) -> str:
        return history.render_changes(entry)

    @admin.display(description="periodic task")
    def display_task(self, entry: TaskHistory) -> str:
        if not PeriodicTask.objects.filter(pk=entry.periodic_task_id).exists():
            return f"{entry.periodic_task_id} (deleted)"
        url = reverse("admin:django_celery_beat_periodictask_change",
                      args=[entry.periodic_task_id])
        return format_html('<a href="{}#history-v{}">{}</a>', url, entry.version,
                           entry.periodic_task_name)

    @admin.display(description="runs planned from this version")
    def display_runs(self, entry: TaskHistory) -> str:
        query = urlencode(
            {"periodic_task__id__exact": entry.periodic_task_id, "definition_version": entry.version}
        )
        return format_html(
            '<a href="{}?{}">the runs</a>', reverse("admin:scheduling_run_changelist"), query
        )
