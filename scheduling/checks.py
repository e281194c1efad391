"""System checks: the settings this app cannot work without, the connection its locks need, a
database migrated all or none of the way the squashed migration stands for, the removed
settings a deployment still sets, and the worker guard's line of Celery configuration."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from celery import current_app
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder
from django.utils.connection import ConnectionDoesNotExist

from scheduling import cadences, guard, ledger
from scheduling.conf import INTERNAL, REMOVED, RemovedSetting, conf
from scheduling.migration_match import OLD_CHAIN_COMMIT, OLD_CHAIN_LAST
from scheduling.sql import queries


@register()
def check_use_tz(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """USE_TZ must be on: slots are aware UTC instants."""
    if settings.USE_TZ:
        return []
    return [
        Error(
            "scheduling needs USE_TZ = True: run slots are stored as aware UTC datetimes.",
            hint="Set USE_TZ = True in your settings (Django's default since 5.0).",
            id="scheduling.E001",
        )
    ]


@register()
def check_removed_settings(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """A removed or renamed ``SCHEDULING_*`` setting in the Django settings: it is ignored now.

    One warning per name of ``conf.REMOVED`` set, in that order: what took its place (a setting
    to set instead, a constant of ``scheduling.cadences`` and its value, or nothing) and what to
    do. Each name warns for at least one minor release after the one that removed it.
    """
    return [
        _removed_warning(removed)
        for removed in REMOVED
        if hasattr(settings, f"SCHEDULING_{removed.name}")
    ]


def _removed_warning(removed: RemovedSetting) -> Warning:
    """The ``scheduling.W003`` warning for one removed setting that is set."""
    old = f"SCHEDULING_{removed.name}"
    where = "(docs/configuration.md, Removed settings)"
    if removed.renamed_to is not None:
        new = f"SCHEDULING_{removed.renamed_to}"
        message = f"it was renamed {new} in {removed.removed_in}."
        hint = f"Rename {old} to {new} in your settings {where}."
    elif removed.name in INTERNAL:
        value = getattr(cadences, removed.name)
        message = f"it is internal now (scheduling.cadences.{removed.name} = {value!r})."
        hint = f"Remove {old} from your settings {where}."
    else:
        message = f"it was removed in {removed.removed_in}, and nothing replaces it."
        hint = f"Remove {old} from your settings {where}."
    return Warning(
        f"{old} is no longer a setting and is ignored: {message}",
        hint=hint, obj=old, id="scheduling.W003",
    )


#: The line of Django settings that installs the worker guard (docs/guard.md).
GUARD_LINE = 'CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]'
GUARD_PATH = "scheduling.guard:GuardAnnotation"


@register()
def check_guard_annotation(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """``scheduling.W004``: the Celery app's ``task_annotations`` do not install the guard.

    Such a worker still writes run rows but runs every delivery's body, duplicates included.
    Read are the current Celery app's setting and the Django setting ``CELERY_TASK_ANNOTATIONS``
    (the same value for an app configured from the Django settings; the Django setting alone
    where the process has no Celery app, as in ``manage.py check`` of a project that defines its
    app elsewhere): no warning when either installs the guard. Every form Celery accepts counts: one annotation or a list or tuple of them, each the
    dotted path ``"scheduling.guard:GuardAnnotation"``, the class, an instance of it, or a dict
    whose ``"*"`` entry maps ``"@before_start"`` to the guard's wrapper (``GuardAnnotation.
    annotate_any()``).
    """
    sources = (
        current_app.conf.task_annotations, getattr(settings, "CELERY_TASK_ANNOTATIONS", None)
    )
    if any(guard_installed(annotations) for annotations in sources):
        return []
    return [
        Warning(
            "The Celery app's task_annotations do not include scheduling.guard:GuardAnnotation: "
            "workers write run rows but run each delivery without the at-most-once guard.",
            hint=f"Add this line to your settings (or the string to your list): {GUARD_LINE}",
            obj="CELERY_TASK_ANNOTATIONS", id="scheduling.W004",
        )
    ]


def guard_installed(annotations: object) -> bool:
    """Return True if a ``task_annotations`` value installs ``guard.GuardAnnotation``."""
    if annotations is None:
        return False
    if not isinstance(annotations, (list, tuple)):
        annotations = (annotations,)
    return any(_is_guard(annotation) for annotation in annotations)


def _is_guard(annotation: object) -> bool:
    if isinstance(annotation, str):
        return annotation.replace(":", ".") == GUARD_PATH.replace(":", ".")
    if isinstance(annotation, dict):
        every_task = annotation.get("*")
        wrapper = guard.GuardAnnotation.annotate_any()["@before_start"]
        return isinstance(every_task, dict) and every_task.get("@before_start") is wrapper
    return annotation is guard.GuardAnnotation or isinstance(annotation, guard.GuardAnnotation)


@register(deploy=False)
def check_postgresql(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The default database must be PostgreSQL: claims use SELECT ... FOR UPDATE SKIP LOCKED."""
    connection = connections["default"]
    if connection.vendor == "postgresql" and connection.features.has_select_for_update_skip_locked:
        return []
    return [
        Error(
            f"scheduling needs PostgreSQL (SELECT ... FOR UPDATE SKIP LOCKED); the default "
            f"database is {connection.vendor}.",
            hint="Point DATABASE_URL (or DATABASES['default']) at PostgreSQL 14 or newer.",
            id="scheduling.E002",
        )
    ]


@register()
def check_direct_database(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """SCHEDULING_DIRECT_DATABASE must name a PostgreSQL alias of DATABASES.

    Nothing to say while the default database is not PostgreSQL itself: E002 says why, and the
    setting (left out, it names ``default``) would only repeat it.
    """
    if check_postgresql():
        return []
    alias = conf.direct_database
    try:
        vendor = connections[alias].vendor
    except ConnectionDoesNotExist:
        vendor = ""
    if vendor == "postgresql":
        return []
    what = "is not PostgreSQL" if vendor else "is not in DATABASES"
    return [
        Error(
            f"SCHEDULING_DIRECT_DATABASE names the database alias {alias!r}, which {what}.",
            hint=(
                "Name an alias of DATABASES that connects to the same PostgreSQL database as "
                "'default' without a connection pooler, or leave the setting out ('default')."
            ),
            id="scheduling.E004",
        )
    ]


@register(Tags.database)
def check_direct_connection(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """The session-level locks' connection must reach the default database without a pooler.

    A database check (Django runs it for ``check --database default`` and before ``migrate``):
    it connects to ``default`` and to ``SCHEDULING_DIRECT_DATABASE``. How a pooler is told:
    ``scheduling.ledger.pooler``.
    """
    alias = conf.direct_database
    if not databases or check_direct_database() or connections["default"].vendor != "postgresql":
        return []
    try:
        pooled = ledger.pooled(alias)
        reached = {name: _server(name) for name in {"default", alias}}
    except DatabaseError as exc:
        return [
            Warning(
                f"scheduling could not check database alias {alias!r} for a connection "
                f"pooler: {exc}",
                id="scheduling.W001",
            )
        ]
    errors: list[CheckMessage] = []
    if pooled:
        errors.append(
            Error(
                f"Database alias {alias!r} reaches PostgreSQL through a connection pooler (the "
                f"server process that runs its queries is not the one it was given at login). "
                f"scheduling holds two session-level advisory locks on it: each beat replica's "
                f"reconcile turn and the worker guard's execution lock of each running task. A "
                f"pooler in transaction mode (PgBouncer's pool_mode = transaction) lends the "
                f"session to other clients between transactions, so those locks are neither "
                f"held nor released reliably, and a duplicate delivery may run.",
                hint=(
                    "Add a DATABASES alias that connects to the same database directly, not "
                    "through the pooler (the PostgreSQL server's own host and port), and set "
                    "SCHEDULING_DIRECT_DATABASE to its name; each beat replica and each worker "
                    "process keeps one connection on it. Everything else may stay on the pooler. "
                    "If the pooler pools by session (pool_mode = session), the locks are safe: "
                    "add 'scheduling.E003' to SILENCED_SYSTEM_CHECKS."
                ),
                id="scheduling.E003",
            )
        )
    if reached["default"] != reached[alias]:
        errors.append(
            Error(
                f"SCHEDULING_DIRECT_DATABASE ({alias!r}) reaches another database than "
                f"'default': database {reached[alias][0]!r} of the server started at "
                f"{reached[alias][1]}, not {reached['default'][0]!r} of the server started at "
                f"{reached['default'][1]}. The lost-worker sweep looks for the guard's "
                f"execution locks in the default database.",
                hint="Point that alias at the database of 'default', without the pooler.",
                id="scheduling.E005",
            )
        )
    return errors


def _server(alias: str) -> tuple[str, object]:
    """(database name, server start time) that connection ``alias`` reaches."""
    with connections[alias].cursor() as cursor:
        cursor.execute(queries["same_server"])
        return tuple(cursor.fetchone())  # type: ignore[return-value]


@register(Tags.database)
def check_squashed_migrations(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """A database must have applied all or none of the 22 migrations squashed into 0001_initial.

    Django counts the squashed migration applied where all of them are and runs it where none
    is; where only some are, it silently does neither, and the app would run on part of its
    schema. A database check (Django runs it before ``migrate`` and for ``check --database``).
    """
    squashed = import_module("scheduling.migrations.0001_initial").Migration
    chain = {"0001_initial", *(name for _, name in squashed.replaces)}
    errors: list[CheckMessage] = []
    for alias in sorted(databases or ()):
        try:
            recorded = MigrationRecorder(connections[alias]).applied_migrations()
        except DatabaseError:
            continue  # an unreachable database: migrate says so itself
        applied = sorted(chain & {name for app, name in recorded if app == "scheduling"})
        if applied and len(applied) < len(chain):
            errors.append(
                Error(
                    f"Database alias {alias!r} applied {len(applied)} of the {len(chain)} "
                    f"migrations of scheduling that 0001_initial squashes (the last: "
                    f"{applied[-1]}), so Django would neither run 0001_initial nor count it "
                    f"applied.",
                    hint=(
                        f"Migrate it to {OLD_CHAIN_LAST} with commit {OLD_CHAIN_COMMIT[:7]} of "
                        f"django-scheduling-ledger, the last that has those migrations: `git -C "
                        f"<checkout> worktree add --detach ../dsl-old {OLD_CHAIN_COMMIT[:7]}`, "
                        f"`pip install ../dsl-old`, `python manage.py migrate scheduling "
                        f"{OLD_CHAIN_LAST}`; then install this release again (`pip install "
                        f"<checkout>`) and run `python manage.py migrate` (docs/operating.md, "
                        f"Upgrading)."
                    ),
                    id="scheduling.E006",
                )
            )
    return errors
