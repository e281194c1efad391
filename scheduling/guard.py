"""Worker-side duplicate guard: at most one execution per run (invariant 3, docs/architecture.md).

Installed on every task by one line of Celery configuration (a task annotation)::

    CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]

The annotation wraps each task class's ``before_start`` (Celery >= 5.2). Celery's tracer calls
``before_start`` in the pool process inside the same ``try`` as the task body, after
``task_prerun``: when it raises ``celery.exceptions.Ignore`` the body is skipped, no result,
success or failure signal is recorded, and the worker acknowledges the message (``Request.
on_failure`` acks an ``Ignore``). That is the hook: a ``task_prerun`` receiver cannot skip the body
(Celery's ``Signal.send`` logs and swallows receiver exceptions, and the prerun call sits outside
that ``try``), and a custom ``Request`` class decides in the consumer process, before the pool,
where the executing process's liveness cannot be held.

For a delivery carrying the ``scheduling_run`` header (every run the scheduler publishes):

1. Take the run's execution lock for this attempt: ``pg_try_advisory_lock`` on the key
   ``scheduling_execution_lock_key(task id, request.retries)`` (a SQL function of
   ``sql/schema.sql``, the one definition of the key), on a PostgreSQL session this process keeps
   for the purpose (``_Liveness``). The lock is held while the body runs and released with the outcome (or at
   ``task_postrun``); when the process dies, its session ends and the server frees the lock. A
   lock held by someone else is the evidence that the attempt is executing on a live worker.
2. In the same statement, a dispatched run (its first delivery) is started: running, the
   verdict's case ``FIRST_DELIVERY`` (``ledger.verdict``). Any other case goes to
   ``ledger.begin_execution``, which reads the run row, asks ``verdict.verdict`` (the rule, one
   table: docs/guard.md) and performs the writes it names, in one transaction; the guard acts on
   the verdict: execute, requeue, or drop (a warning is logged with
   ``extra={"action": "suppress"}``, and ``Ignore`` is raised). A run whose worker died mid-task
   executes again only when the broker redelivered the message and the lock was free.
3. The outcome (``scheduling.worker``) is one statement on the same session: the run's final
   status and the lock's release (``_Liveness.finish``). Django's connection is not opened for
   a first delivery at all, so the fix-up's closing it around every task costs nothing.

Deliveries without the header (tasks not sent by the scheduler) cost one dictionary lookup.
When the database cannot be reached, the guard waits ``RETRY_DELAY`` seconds and raises
``Reject(requeue=True)``: the message goes back to the broker and nothing runs unguarded. The
process logs the outage once and the return once (``scheduling.database_reach``), each naming
the server. When its statement names a function, column or table the database does not have
and the database's migrations lag this code (``migration_match``), the guard holds the message
instead, re-checking them with backoff, and decides again once they match; after
``MIGRATIONS_HOLD`` seconds it hands the message back (``Reject(requeue=True)``), so a worker
deployed before ``migrate`` ran requeues each message at most once per hold, not once a second.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from celery.exceptions import Ignore, Reject

logger = logging.getLogger(__name__)

#: Headers every scheduled run carries (``scheduling.run_message``' names; not imported here so
#: that this module loads before Django is set up, when Celery resolves the annotation).
HEADER_RUN = "scheduling_run"
HEADER_TASK_NAME = "periodic_task_name"
HEADER_SCHEDULED_FOR = "scheduled_for"
#: Attribute set on a guarded ``before_start``, so the worker signals know the guard is installed.
GUARD_MARK = "_scheduling_guard"
#: Attribute of the task request naming the execution lock to release at ``task_postrun``.
LOCK_ATTRIBUTE = "scheduling_lock"
#: Seconds to wait before handing a message back when the database is unreachable.
RETRY_DELAY = 1.0
#: Seconds a message is held while the database's migrations lag this code, before it is handed
#: back to the broker (and delivered again, to be held again).
MIGRATIONS_HOLD = 30.0


class GuardAnnotation:
    """Celery task annotation that wraps ``before_start`` of every task with the guard.

    Its methods are static, so ``task_annotations`` may name the class by its dotted path, hold
    the class itself or an instance: Celery calls them on whichever it is given.
    """

    @staticmethod
    def annotate(task: Any) -> None:
        """Nothing task-specific (Celery asks per task first)."""
        return None

    @staticmethod
    def annotate_any() -> dict[str, Callable[..., Any]]:
        """Return the attributes for every task: ``@before_start`` wraps the existing method."""
        return {"@before_start": _guarded}


def _guarded(original: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(original, GUARD_MARK, False):
        return original

    def before_start(self: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        request = self.request
        if request.get(HEADER_RUN) is not None and not request.get("is_eager"):
            guard(request, task_id)
        return original(self, task_id, args, kwargs)

    before_start.__doc__ = original.__doc__
    setattr(before_start, GUARD_MARK, True)
    return before_start


def is_guarded(task: Any) -> bool:
    """Return True if ``task``'s class runs the guard in ``before_start``."""
    return bool(getattr(task.before_start, GUARD_MARK, False))


def guard(request: Any, task_id: str) -> None:
    """Run the guard for one delivery; return to execute the body, raise Ignore to drop it.

    A first delivery of a dispatched run costs one statement on this process's own session
    (``_Liveness.start``: the execution lock and the start); every other case is decided by
    ``ledger.begin_execution`` on Django's connection (the verdict, ``ledger.verdict``). Raises
    ``Reject(requeue=True)`` after ``RETRY_DELAY`` seconds when the database fails.
    """
    from django.db import DatabaseError, InterfaceError

    from scheduling.database_reach import database

    key = Attempt(task_id, int(request.get("retries") or 0))
    try:
        exclusive, started = liveness.start(key, request.get("hostname") or "")
        found = None if started else _decide(request, key, exclusive)
    except (DatabaseError, InterfaceError, OSError, *liveness.errors) as exc:
        if _held_for_migrations(exc, task_id):
            return guard(request, task_id)  # the migrations match now: decide again
        database.lost(exc)  # one ERROR per outage; each message's line below at info
        logger.info(
            "run %s: cannot reach the ledger (%s); message requeued in %.0fs",
            task_id, exc, RETRY_DELAY, extra={"action": "guard_requeue"},
        )
        time.sleep(RETRY_DELAY)
        raise Reject(f"ledger unreachable: {exc}", requeue=True) from exc
    database.reached(session=liveness.address())
    if found is None:  # started: released with the outcome, or at task_postrun
        setattr(request, LOCK_ATTRIBUTE, key)
        return
    _follow(request, key, exclusive, found)


def _held_for_migrations(exc: BaseException, task_id: str) -> bool:
    """Hold a delivery whose guard failed on an undefined object while the database's
    migrations lag this code: re-check them with backoff; return True once they match.

    Returns False at once when ``exc`` is something else or the migrations match (the caller's
    outage path). Raises ``Reject(requeue=True)`` after ``MIGRATIONS_HOLD`` seconds.
    """
    from scheduling.migration_match import undefined_object

    migrations = migration_wait()
    if not undefined_object(exc) or not migrations.behind_or_unknown():
        return False
    held = 0.0
    while held < MIGRATIONS_HOLD:
        wait = migrations.delay()
        time.sleep(wait)
        held += wait
        if not migrations.behind_or_unknown():
            return True
    logger.info(
        "run %s: the database's migrations lag this worker's code; message requeued after "
        "%.0fs", task_id, held, extra={"action": "guard_requeue"},
    )
    raise Reject(f"migrations lag this code: {task_id}", requeue=True) from exc


def _decide(request: Any, key: Attempt, exclusive: bool) -> Any:
    """``ledger.begin_execution``'s verdict on a delivery the one-statement start did not
    start; the execution lock (held when ``exclusive``) is released if it raises."""
    from scheduling import ledger

    delivery = request.get("delivery_info") or {}
    try:
        return ledger.begin_execution(
            key.task_id,
            request.get("hostname") or "",
            retries=key.retries,
            redelivered=bool(delivery.get("redelivered")),
            exclusive=exclusive,
            slot=_slot(request),
        )
    except BaseException:
        if exclusive:
            liveness.unlock(key)
        raise


def _follow(request: Any, key: Attempt, exclusive: bool, found: Any) -> None:
    """Act on ``begin_execution``'s verdict ``found``, deciding nothing: execute (return, the
    lock kept), execute untracked (return), requeue (``Reject``) or drop (``Ignore``); the
    attempt's lock, when this process took it (``exclusive``), is released but for an execution."""
    from scheduling.ledger import Outcome

    task_id = key.task_id
    if found.outcome == Outcome.EXECUTE:
        setattr(request, LOCK_ATTRIBUTE, key)  # released by the outcome or at task_postrun
        logger.info("run %s executes: %s", task_id, found.reason, extra={"action": "execute"})
        return
    if exclusive:
        liveness.unlock(key)
    if found.outcome == Outcome.UNTRACKED:
        return
    if found.outcome == Outcome.REQUEUE:
        logger.info(
            "run %s: %s; message requeued in %.0fs", task_id, found.reason, RETRY_DELAY,
            extra={"action": "guard_requeue"},
        )
        time.sleep(RETRY_DELAY)
        raise Reject(f"run not in the ledger yet: {task_id}", requeue=True)
    from scheduling import metrics

    metrics.observe_suppressed(
        request.get("periodic_task_name") or "", request.get("hostname") or ""
    )
    redelivered = bool((request.get("delivery_info") or {}).get("redelivered"))
    logger.warning(
        "run %s: duplicate delivery suppressed (%s; retries=%d, redelivered=%s)",
        task_id, found.reason, key.retries, redelivered, extra={"action": "suppress"},
    )
    raise Ignore(f"duplicate delivery of run {task_id}: {found.reason}")


def _slot(request: Any) -> tuple[str, datetime] | None:
    """The periodic task name and slot (aware UTC) a scheduler message names, if readable."""
    name, stamp = request.get(HEADER_TASK_NAME), request.get(HEADER_SCHEDULED_FOR)
    try:
        moment = datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        return None
    if not name or moment.tzinfo is None:
        return None
    return str(name), moment


class Attempt(NamedTuple):
    """One attempt of a run: its execution lock is ``scheduling_execution_lock_key(*attempt)``."""

    task_id: str
    retries: int


class _Liveness:
    """This process's own PostgreSQL session: the execution locks and the guarded runs' writes.

    Separate from Django's connections, which Celery's Django fix-up closes around every task
    (unless ``CELERY_DB_REUSE_MAX``) and task code may close at will: the lock must live exactly
    as long as this process, and a first delivery's start and its outcome cost one statement
    each on a session that stays open (``start``, ``finish``), prepared where the server keeps
    them. One session per process, opened on first use, opened anew in a forked child (the
    parent's is left alone) and after any error (closing it frees every lock it held: nothing is
    left half done, no transaction is left open), shared by threads under a mutex, opened with
    the parameters of ``SCHEDULING_DIRECT_DATABASE``: a pooler by transaction would leave a lock
    on a server session this process may not be lent again, where the next client holds it too.
    A session found to go through a pooler is used all the same (a pooler by session keeps the
    locks) and reported (``pooler.report_pooled_locks``; system check scheduling.E003); there its
    statements are prepared only if the pooler keeps prepared statements
    (``pooler.pooler_keeps_prepared``). TCP keepalives and user timeouts on both ends
    (``ledger.session.Keepalives``, from ``cadences.TCP_KEEPALIVES_IDLE``) let the server free
    the locks of a host cut off silently, and this process notice it, within the keepalive bound
    (11 s by default).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._conn: Any = None
        self._pid = 0
        self._prepare = False
        self._held: set[Attempt] = set()
        #: Sessions inherited from a parent process: kept, never closed here (closing one would
        #: end the parent's server session).
        self._inherited: list[Any] = []
        import psycopg

        self.errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def _mine(self) -> bool:
        return self._conn is not None and self._pid == os.getpid() and not self._conn.closed

    def _connection(self) -> Any:
        if self._mine():
            return self._conn
        if self._conn is not None and self._pid != os.getpid():
            self._inherited.append(self._conn)  # a forked child: the parent's, left alone
        import psycopg
        from django.db import connections

        from scheduling.conf import conf
        from scheduling.ledger import pooler
        from scheduling.ledger.session import keepalives
        from scheduling.sql import queries

        alias = conf.direct_database
        params = connections[alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        bounds = keepalives()
        params.update(bounds.client_parameters(), application_name="scheduling-guard",
                      prepare_threshold=None)  # prepared only where asked: _execute
        conn = psycopg.connect(**params, autocommit=True)
        if pooler.behind_pooler(conn):  # no session setting: it would reach the next client
            pooler.report_pooled_locks(alias, "the worker guard's execution locks")
            self._prepare = pooler.pooler_keeps_prepared(conn)
        else:
            conn.execute(queries["guard_keepalives"], bounds.server_settings())
            self._prepare = True
        self._conn, self._pid = conn, os.getpid()
        self._held = set()  # locks of a session lost with its connection are gone
        return conn

    def _execute(self, statement: str, params: Any, *, prepare: bool = False) -> tuple[Any, ...]:
        """Run ``statement`` on this process's session (the caller holds the mutex) and return
        its one row. On any error the session is closed (the server frees its locks) and the
        error raised: the next statement opens a new one."""
        conn = self._connection()
        try:
            return conn.execute(statement, params, prepare=prepare and self._prepare).fetchone()
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._mine():
            self._conn.close()
        self._conn, self._held = None, set()

    def start(self, key: Attempt, worker: str) -> tuple[bool, bool]:
        """Take the lock of attempt ``key`` without waiting and start its run if dispatched.

        One statement (``start_execution``: the function ``scheduling_start_execution``).
        Returns (lock held now, run started); a run started is running, with ``started_at``,
        ``worker`` (cut to 255 characters), ``key.retries`` and one execution more. Raises
        psycopg.Error (the session is closed).
        """
        from scheduling.sql import queries

        with self._mutex:
            if key in self._held and self._mine():  # the same attempt twice: a duplicate
                return False, False
            params = {"task_id": key.task_id, "retries": key.retries, "worker": worker[:255]}
            mine, run_id = self._execute(queries["start_execution"], params, prepare=True)
            if mine:
                self._held.add(key)
            return bool(mine), run_id is not None

    def finish(self, key: Attempt, status: str, error: str = "") -> bool:
        """Record attempt ``key``'s outcome ``status`` and release its lock, in one statement.

        ``ledger.record_finished``'s rule (``finish_execution``: ``scheduling_finish_execution``);
        ``error`` is cut to ``ERROR_LIMIT``. Returns True if a run took the outcome. Raises
        psycopg.Error (the session is closed, its locks with it).
        """
        from scheduling.ledger.writes import ERROR_LIMIT
        from scheduling.models import Run
        from scheduling.sql import queries

        with self._mutex:
            held = key in self._held and self._mine()
            params = {
                "task_id": key.task_id, "retries": key.retries, "status": status,
                "error": error[:ERROR_LIMIT], "late": Run.Reason.LATE_OUTCOME, "held": held,
            }
            updated, _ = self._execute(queries["finish_execution"], params, prepare=True)
            self._held.discard(key)
            return bool(updated)

    def try_lock(self, key: Attempt) -> bool:
        """Take the lock of attempt ``key`` without waiting; True if this session holds it now.

        Raises psycopg.Error (the session is closed)."""
        from scheduling.sql import queries

        with self._mutex:
            if key in self._held and self._mine():  # the same attempt twice in this process
                return False
            (mine,) = self._execute(queries["try_execution_lock"], key)
            if mine:
                self._held.add(key)
            return bool(mine)

    def unlock(self, key: Attempt) -> None:
        """Release ``key`` if held; a lost session has released it already. Never raises."""
        from scheduling.sql import queries

        with self._mutex:
            if key not in self._held or not self._mine():
                return
            self._held.discard(key)
            try:
                self._execute(queries["release_execution_lock"], key)
            except self.errors:
                logger.warning("could not release execution lock %s; dropped the session", key)

    def address(self) -> str:
        """``host:port`` of the server this process's session is on (after a failover, the
        promoted standby), "" while it has none. No query; never raises."""
        try:
            return f"{self._conn.info.host}:{self._conn.info.port}" if self._mine() else ""
        except Exception:  # noqa: BLE001 - closed meanwhile: no address to tell
            return ""

    def backend_pid(self) -> int | None:
        """The server process id of this process's session, or None while it has none."""
        with self._mutex:
            return int(self._conn.info.backend_pid) if self._mine() else None

    def close(self) -> None:
        """Close this process's session (its locks are released by the server)."""
        with self._mutex:
            self._drop()


liveness = _Liveness()


@functools.cache
def migration_wait() -> Any:
    """This process's ``migration_match.MigrationWait``, made at first use (it imports Django's
    migration modules, which this module must not at import). Logs at WARNING: the worker's own
    check at start (``scheduling.worker``) logs the gap at ERROR."""
    from scheduling.migration_match import MigrationWait

    return MigrationWait(
        "worker process", "holds the scheduled runs it takes until the migrations match its code",
        level=logging.WARNING,
    )
