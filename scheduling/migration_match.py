"""Whether the database's migrations of scheduling match this code, and waiting until they do.

A replica or worker of a release whose migrations have not run (code deployed before
``manage.py migrate``) would otherwise fail every tick on a missing column or function, or hand
every run back to the broker; one of the release before, on a database a newer release migrated
(a rolling deploy), goes on: it logs the gap once at WARNING. ``migration_gap``
compares the migrations of the app on disk with those the database recorded (Django's
``MigrationExecutor.migration_plan`` to the app's leaf nodes, and ``MigrationRecorder``'s
applied ones); ``MigrationWait`` logs a gap once, at ERROR, with what to run, re-checks with
a capped backoff while the caller claims or executes nothing, and logs once when the gap is
closed. Checked at a replica's start, at a worker's start, and when a statement fails on an
undefined column, function or table (SQLSTATE 42703, 42883, 42P01).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from scheduling import cadences
from scheduling.backoff import retry_delay

logger = logging.getLogger(__name__)

APP = "scheduling"
#: SQLSTATEs of a statement naming a column, function or table the database does not have.
UNDEFINED_OBJECT = frozenset({"42703", "42883", "42P01"})
#: The last commit of the repository whose migrations are 0001_initial to 0023_owed_run_count,
#: before they were squashed (docs/operating.md, Upgrading).
OLD_CHAIN_COMMIT = "17fdc8db76572b7f15401c98c3001d0f0ef995c0"
OLD_CHAIN_LAST = "0023_owed_run_count"
MIGRATE = "python manage.py migrate"


def undefined_object(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver error, or Django's wrapping it) names an undefined column,
    function or table."""
    state = getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)
    return state in UNDEFINED_OBJECT


@dataclass(frozen=True)
class MigrationGap:
    """What differs between this code's migrations of scheduling and a database's.

    ``missing``: this code's migrations the database has not applied, in the order ``migrate``
    applies them. ``unknown``: migrations the database applied that this code does not have (a
    newer release migrated it). ``squashed_part``: where the database applied only some of the
    migrations that 0001_initial squashes (the last one applied), else "".
    """

    missing: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    squashed_part: str = ""

    def __bool__(self) -> bool:
        return bool(self.missing or self.unknown or self.squashed_part)

    @property
    def lags(self) -> bool:
        """Whether this code must wait: the database lacks some of its migrations (or holds
        only part of the squashed chain). A newer release's migrations alone do not stop it:
        each release's migrations leave the schema usable by the release before (a rolling
        deploy runs both side by side)."""
        return bool(self.missing or self.squashed_part)

    def describe(self) -> str:
        """One sentence or two: what differs and the command that closes the gap."""
        if self.squashed_part:
            return (
                f"the database applied the old migrations of scheduling only up to "
                f"{self.squashed_part}; run `{MIGRATE} scheduling {OLD_CHAIN_LAST}` with "
                f"commit {OLD_CHAIN_COMMIT[:7]} of django-scheduling-ledger (the last with "
                f"those migrations), then `{MIGRATE}` with this release (docs/operating.md, "
                f"Upgrading)"
            )
        parts = []
        if self.missing:
            parts.append(
                f"the database lacks migration(s) {', '.join(self.missing)} of scheduling; "
                f"run `{MIGRATE}` with this release"
            )
        if self.unknown:
            parts.append(
                f"the database applied migration(s) {', '.join(self.unknown)} of scheduling, "
                f"which this code does not have (a newer release migrated it); run the newer "
                f"release, or go back with `{MIGRATE} scheduling <migration>` using it"
            )
        return "; ".join(parts)


def migration_gap(using: str = "default") -> MigrationGap:
    """Compare this code's migrations of scheduling with those database ``using`` applied.

    Reads the migration modules and one table (django_migrations). Raises DatabaseError when
    the database cannot be read.
    """
    connection = connections[using]
    recorded = {
        name for app, name in MigrationRecorder(connection).applied_migrations() if app == APP
    }
    executor = MigrationExecutor(connection)
    loader = executor.loader
    known = {name for app, name in loader.disk_migrations if app == APP}
    for (app, name), migration in loader.replacements.items():
        if app != APP:
            continue
        chain = {name, *(replaced for _, replaced in migration.replaces)}
        applied = sorted(chain & recorded)
        if applied and len(applied) < len(chain):
            return MigrationGap(squashed_part=applied[-1])
        known |= chain
    plan = executor.migration_plan(loader.graph.leaf_nodes(APP))
    missing = tuple(m.name for m, backwards in plan if m.app_label == APP and not backwards)
    return MigrationGap(missing=missing, unknown=tuple(sorted(recorded - known)))


class MigrationWait:
    """One process's wait for the database's migrations to match its code.

    ``behind()`` checks (the first call, or any while waiting) and says whether to wait (the
    database lacks migrations of this code: ``MigrationGap.lags``); a gap is logged once at
    ``level`` (a different gap while it lasts at INFO), its end once at
    WARNING, and
    ``on_match`` is called then. ``delay()`` is the seconds to wait before the next check: the
    replicas' capped, jittered backoff (``cadences.RETRY_BACKOFF_MAX``). Thread-safe; a forked
    child starts from its parent's state, so a gap its parent logged is not logged again.
    """

    def __init__(self, who: str, doing: str, *, level: int = logging.ERROR,
                 on_match: Callable[[], None] | None = None) -> None:
        self.who, self.doing, self.level = who, doing, level
        self.on_match = on_match
        self.waiting = False
        self.checks = 0  # checks in a row that found a gap
        self._logged = MigrationGap()
        self._mutex = threading.Lock()

    def behind(self, using: str = "default") -> bool:
        """Check the migrations; return True while they do not match this code.

        Raises DatabaseError when the database cannot be read (the caller's outage path).
        """
        gap = migration_gap(using)
        lags = gap.lags
        with self._mutex:
            was_waiting, self.waiting = self.waiting, lags
            self.checks = self.checks + 1 if lags else 0
            if gap and gap != self._logged:
                # The first gap of a wait at ``level``; one that changes while it lasts (a
                # ``migrate`` applying the missing migrations one by one) at INFO; a newer
                # release's migrations alone (a rolling deploy) once at WARNING, going on.
                first, self._logged = not self._logged, gap
                level = (self.level if first else logging.INFO) if lags else logging.WARNING
                logger.log(
                    level, "%s %s: %s", self.who, self.doing if lags else "goes on",
                    gap.describe(), extra={"action": "migrations_behind"},
                )
            elif gap:
                logger.debug("%s: migrations still do not match: %s", self.who, gap.describe())
        if not lags and was_waiting:
            self._logged = MigrationGap()
            logger.warning(
                "%s: the database's migrations of scheduling match this code now; resuming",
                self.who, extra={"action": "migrations_match"},
            )
            if self.on_match is not None:
                self.on_match()
        return lags

    def behind_or_unknown(self, using: str = "default") -> bool:
        """``behind()``, where a database that cannot be read counts as behind (checked again
        at the next call)."""
        try:
            return self.behind(using)
        except DatabaseError:
            self.waiting = True
            return True

    def delay(self) -> float:
        """Seconds to wait before the next check (at least a quarter second)."""
        return retry_delay(max(self.checks, 1), cadences.RETRY_BACKOFF_MAX)
