"""Celery beat glue: ``LedgerScheduler``, run in every container, with no leader.

    celery -A project beat -S scheduling.schedulers:LedgerScheduler

Each tick polls the ledger once (``ledger.poll``); when a run is due it claims, publishes and
commits in one transaction (``ledger.claim_and_dispatch``); when a periodic task changed it
re-plans (``ledger.reconcile``). No SQL here, and no periodic task is held in memory.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from functools import cached_property, partial
from typing import Any

from celery.beat import ScheduleEntry
from django.db import DatabaseError, InterfaceError, OperationalError
from django_celery_beat.schedulers import DatabaseScheduler
from kombu.exceptions import OperationalError as KombuOperationalError

from scheduling import cadences, ledger, metrics, signals
from scheduling.backoff import retry_delay
from scheduling.beat_schedule import sync_beat_schedule
from scheduling.broker_options import (
    broker_timeout_options,
    pin_publish_settings,
    publisher_confirm_options,
)
from scheduling.builtin_prune import BuiltinPrune
from scheduling.conf import conf
from scheduling.exceptions import PublishFailed, describe
from scheduling.migration_match import MigrationWait, undefined_object
from scheduling.models import Run
from scheduling.overdue_watch import OverdueWatch
from scheduling.publisher import PUBLISH_RETRY_POLICY, RunPublisher
from scheduling.replicas import Heartbeat
from scheduling.run_message import Message

logger = logging.getLogger(__name__)

__all__ = ["TURN_PATIENCE", "LedgerScheduler", "next_batch_size"]

_UNSEEN = object()
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT}
#: Statuses of the runs a claim ended without dispatching them (announced as run_finished).
_ENDED = frozenset({Run.Status.MISSED, Run.Status.SKIPPED, Run.Status.FAILED})
#: Seconds a replica waits for another replica's reconcile turn before it takes the holder to be
#: stuck and reconciles anyway. A pass normally takes milliseconds; a full one over 100,000 tasks
#: 0.2 s, or about 8 s on 2 cores when it plans them all from nothing (a first deployment), and a
#: pass that outlasts the patience is only repeated: passes are safe concurrently.
TURN_PATIENCE = 10.0

class LedgerScheduler(DatabaseScheduler):
    """A django-celery-beat ``DatabaseScheduler`` whose runs are claimed from the run ledger.

    Every replica runs this same class. A run is dispatched by whichever replica commits its claim
    first; the others skip the locked row. ``tick()`` returns the seconds to sleep: until the next
    pending run is due, at most ``cadences.MAX_INTERVAL`` (0.5 s by default), and 0 while due runs
    remain. Database errors are logged once per outage and retried with capped backoff and jitter;
    the replica never exits for them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.replica_id = conf.replica_id
        self._marker: object = _UNSEEN
        self._last_reconcile = 0.0
        self._last_full_reconcile: float | None = None
        self._turn_awaited_since: float | None = None
        self._failures = 0
        self._failing = ""
        self._database_address = ""  # host:port of the last server a tick reached
        self.heartbeat = Heartbeat(self.replica_id)
        self._prune = BuiltinPrune()
        self._overdue = OverdueWatch(self.replica_id)
        self._lost = ledger.LostExecutions(conf.worker_lost_after)
        self._settled = ledger.SettledChanges()
        self._book = ledger.TaskBook()  # settles what claims owe the task rows (last_run_at, ...)
        self._floor = ledger.DueFloor()  # where the poll and the claim start their scans
        self._batch = cadences.BATCH_SIZE  # the next claim's size: it grows in a herd (next_batch_size)
        self._migrations = MigrationWait(
            f"replica {self.replica_id}", "claims nothing until the migrations match its code",
            on_match=self._sync_beat_schedule)
        super().__init__(*args, **kwargs)
        self.max_interval = cadences.MAX_INTERVAL
        pin_publish_settings(self.app)
        self.app.conf.task_publish_retry_policy = PUBLISH_RETRY_POLICY
        self._runs = RunPublisher(self)
        # Register the project's tasks (autodiscovery) so unknown task names can be told apart.
        self.app.loader.import_default_modules()

    # django-celery-beat loads every enabled task into an in-memory heap; the ledger replaces it.
    @property
    def schedule(self) -> dict[str, Any]:
        return {}

    def setup_schedule(self) -> None:
        """Sync ``CELERY_BEAT_SCHEDULE`` into periodic tasks; an unchanged entry writes nothing.

        Also opens the metrics port when configured, and when ``task_always_eager`` is on warns
        once and turns it off in this process: here, not in ``__init__``, because beat's start-up
        banner builds a second, lazy scheduler that never sets up its schedule. Where the
        database's migrations do not match this code, the sync waits for them, as the ticks do.
        """
        if conf.metrics_port is not None:
            metrics.serve(conf.metrics_port, conf.metrics_addr)
        if self.app.conf.task_always_eager:
            logger.warning(
                "task_always_eager is on: this replica still sends every run to the broker for a"
                " worker to run, but tasks your code calls with .delay() run inline, without a"
                " worker or the ledger", extra={"action": "always_eager"},
            )
            # Off in this process: beat's apply_async would run each run inline, inside the
            # replica's claim transaction, with no worker and no guard.
            self.app.conf.task_always_eager = False
        if not self._migrations.behind_or_unknown():
            self._sync_beat_schedule()

    def _sync_beat_schedule(self) -> None:
        if self.app.conf.beat_schedule:
            sync_beat_schedule(self.app.conf.beat_schedule)

    def install_default_entries(self, data: Any) -> None:
        """Add nothing: result cleanup is configured like any other periodic task."""

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send ``entry``'s message as Celery beat does (``Scheduler.apply_async``: the registered
        task's ``apply_async``, else ``send_task``, with Celery's own beat headers).

        Called by ``apply_entry`` for each run a claim or redelivery publishes
        (``publisher.RunPublisher``), so what wraps either method sees every run. Never advances
        ``entry``'s schedule: the ledger decides what is due. Returns Celery's AsyncResult;
        raises beat's SchedulingError when the publish failed, after telling the publisher,
        since ``apply_entry`` only logs the error and the run's claim must roll back.
        """
        try:
            result = super().apply_async(entry, producer=producer, advance=False, **kwargs)
        except Exception as exc:
            self._runs.failed(entry, exc)
            raise
        self._runs.sent(entry)
        return result

    def sync(self) -> None:
        """Nothing to write back here: every dispatch is committed when it happens, and the
        tasks' bookkeeping columns are settled by ``tick`` and ``close`` (``ledger.TaskBook``)."""

    def close(self) -> None:
        """Record a clean shutdown in the replica's heartbeat row, then close as beat does.

        A stop calls this twice: Celery's SIGTERM/SIGINT handler first, at whatever instant the
        signal came, then beat's own exit once the handler's SystemExit has unwound the tick.
        The first may interrupt a statement (a poll, a reconcile pass waiting on a lock): a query
        sent then would wait for ever on psycopg's connection lock, which the interrupted call
        holds. So the session is made fit first (``ledger.ready_for_stop``: the statement in
        flight is cancelled, and the interrupted pass unwinds at once, releasing the reconcile
        turn) and the stop is recorded only on a session that is idle: by the second call when
        the first found it busy or inside a transaction whose rollback would undo the write.
        """
        if ledger.ready_for_stop():
            self._book.settle()  # never raises
            self.heartbeat.stop()
        super().close()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Run one scheduler pass (while the migrations lag, a check of them); return the
        seconds to sleep before the next."""
        try:
            if self._migrations.waiting and self._migrations.behind():
                return self._migrations.delay()
            delay = self._tick()
        except (OperationalError, InterfaceError) as exc:
            return self._failed("database", exc)
        except DatabaseError as exc:  # a data or lock error, not an outage: say which
            if undefined_object(exc) and self._migrations.behind_or_unknown():
                return self._migrations.delay()
            logger.exception("database error in a tick", extra={"action": "db_error"})
            return self._failed("database", exc)
        except (PublishFailed, KombuOperationalError, ConnectionError, OSError) as exc:
            self._reset_producer()
            return self._failed("broker", exc)
        except Exception as exc:  # noqa: BLE001 - a replica must outlive any one bad tick
            logger.exception("scheduler tick failed", extra={"action": "tick_failed"})
            return self._failed("tick", exc)
        # A tick that never reached the broker (nothing due, or every due run locked by another
        # replica) proves nothing about it: the broker is back only once a claim's publishes
        # succeeded, which ``_tick`` reports before a deferred stop signal can cut it short.
        self._database_address = ledger.server_address() or self._database_address
        if self._failures and self._failing != "broker":
            self._recovered()
        self._overdue.step()  # missed-run alerts, outside any claim; never raises
        self._book.step()  # the tasks' last_run_at/total_run_count once a minute; never raises
        self.heartbeat.beat()  # display only, after the claim committed; never raises
        return delay

    def _tick(self) -> float:
        ledger.configure_session()
        grace = timedelta(seconds=conf.misfire_grace_seconds)
        poll, floor = self._poll()
        stale = poll.change_marker != self._marker or (
            time.monotonic() - self._last_reconcile >= cadences.RECONCILE_INTERVAL
        )
        if stale or self._turn_awaited_since is not None:
            # A pass, this replica's or another's, may plan runs due in the past: below the floor.
            self._floor.drop()
            if self._take_turn(poll, grace) or floor is not None:
                poll, _ = self._poll()
        wait = poll.seconds_until_due()
        if wait is None or wait > 0:
            # One small batch when configured and due, outside any claim; when a run is due within
            # a quarter second, within the prune's share of a busy replica's time.
            self._prune.step(busy=wait is not None and wait <= 0.25)
            return min(self.max_interval, wait if wait is not None else self.max_interval)
        self._connected_producer()  # reach the broker before taking any lock
        with _stop_signals_deferred(), self._publish_batch() as buffered:
            started = time.monotonic()
            dispatched = self._claim(grace, buffered.flush)
            self._batch = next_batch_size(self._batch, len(dispatched))
            if dispatched and self._failures and self._failing == "broker":
                self._recovered()  # published and committed: the broker took them
        self.heartbeat.claimed(len(dispatched))
        metrics.observe_claim(dispatched, self.replica_id, time.monotonic() - started)
        signals.announce_finished(*(d.task_id for d in dispatched if d.status in _ENDED))
        self._prune.step(busy=True)  # a replica never idle prunes too (builtin_prune.BUSY_SHARE)
        # More may be due (a full batch) or planned already due (a catching-up interval): look
        # again at once. Runs locked by other replicas are theirs; come back after a short nap.
        return 0.0 if dispatched else min(self.max_interval, 0.05)

    def _claim(self, grace: timedelta, flush: Callable[[], None]) -> list[ledger.Dispatched]:
        """Claim due runs, publish them, commit: one ``ledger.claim_and_dispatch`` transaction.

        ``flush`` sends what the publish batch holds (``_publish_batch``). Returns what was
        committed, empty when nothing was due or every due run is claimed by another replica.
        Called with the stop signals held and the publish batch open.
        """
        return ledger.claim_and_dispatch(
            self._publisher(),
            replica_id=self.replica_id,
            batch_size=self._batch,
            grace=grace,
            flush=flush,
            book=self._book,
            floor=self._floor.value,
            revoke=self._revoke,
        )

    def _revoke(self, task_ids: list[str]) -> None:
        """Revoke the started runs overlap policy replace terminates: Celery's revoke (``celery.app.control.Control.revoke``)
        with ``terminate`` (SIGTERM to the pool process running each; the worker then records
        the run failed, revoked). A broadcast: brokers without one (kombu's SQL transport)
        drop it, and the runs finish instead."""
        self.app.control.revoke(task_ids, terminate=True, signal="SIGTERM")

    def _poll(self) -> tuple[ledger.Poll, datetime | None]:
        """``ledger.poll`` from the replica's due floor, and that floor. A poll from no floor
        sets it, except while the replica awaits its reconcile turn: another replica's pass may
        then plan runs due in the past at any moment, and every poll reads the whole index."""
        floor = self._floor.value
        poll = ledger.poll(floor=floor)
        self._floor.seen(
            poll.now, poll.next_due, full=floor is None and self._turn_awaited_since is None
        )
        return poll, floor

    def _take_turn(self, poll: ledger.Poll, grace: timedelta) -> bool:
        """Reconcile when it is this replica's turn; return whether it did.

        One replica reconciles at a time (``ledger.reconcile_turn``): one that finds the turn
        taken defers its pass and goes on dispatching, and asks again each tick. It does not
        trust the holder's pass, which may end with its session (killed, or frozen inside a
        transaction past ``cadences.IDLE_IN_TRANSACTION_TIMEOUT``) and be rolled back: once
        the turn is free it passes itself (a pass for what changed costs milliseconds). If the
        turn stays taken for ``TURN_PATIENCE`` seconds the holder is taken to be stuck (frozen
        between transactions by SIGSTOP or a paused VM: its session, and the lock, live on) and
        this replica passes anyway; passes are safe concurrently, only wasteful.
        """
        now = time.monotonic()
        waited = now - self._turn_awaited_since if self._turn_awaited_since is not None else 0.0
        with ledger.reconcile_turn() as mine:
            if not mine and waited < TURN_PATIENCE:
                if self._turn_awaited_since is None:
                    self._turn_awaited_since = now
                return False
            if not mine:
                logger.warning(
                    "another replica has held the reconcile turn for %.0f s; reconciling anyway",
                    waited, extra={"action": "reconcile_turn_stuck", "replica": self.replica_id},
                )
            try:
                self._reconcile(grace)
            except Exception as exc:  # noqa: BLE001 - planning trouble must not stop dispatching
                if isinstance(exc, (OperationalError, InterfaceError)) or _session_ended(exc):
                    raise  # an outage, retried; the pass is not counted as made
                logger.exception(
                    "reconcile failed; due runs are still dispatched, next try in %.0f s",
                    cadences.RECONCILE_INTERVAL, extra={"action": "reconcile_failed"},
                )
        self._turn_awaited_since = None
        self._marker = poll.change_marker
        self._last_reconcile = now
        return True

    def _reconcile(self, grace: timedelta) -> None:
        """Reconcile from the change log; check every task at start and every full interval."""
        started = time.monotonic()
        full = self._last_full_reconcile is None or (
            started - self._last_full_reconcile >= cadences.FULL_RECONCILE_INTERVAL
        )
        planned = ledger.reconcile(grace, full=full, lost=self._lost, settled=self._settled)
        metrics.observe_worker_lost([name for _, name in self._lost.closed], self.replica_id)
        signals.announce_finished(*(task_id for task_id, _ in self._lost.closed))
        self._redeliver()
        if full:
            self._last_full_reconcile = started
            logger.info(
                "full reconcile: planned %d runs in %.3f s", planned, time.monotonic() - started,
                extra={"action": "reconcile", "replica": self.replica_id},
            )

    def _redeliver(self) -> None:
        """Publish again the dispatched runs no worker started, and the lost runs to recover.

        Part of the reconcile pass (``ledger.redeliver``, invariant 9), after the lost-worker
        sweep. A broker that cannot be reached skips it for this pass (the claim then reports the
        outage); a publish that fails rolls it back and the next pass tries again.
        """
        try:
            self._connected_producer()
        except (KombuOperationalError, ConnectionError, OSError) as exc:
            logger.warning(
                "broker unreachable: nothing re-published in this pass (%s)", exc,
                extra={"action": "republish_skipped", "replica": self.replica_id},
            )
            return
        with self._publish_batch() as buffered:
            done = ledger.redeliver(
                ledger.Republisher(self._publisher(), buffered.flush, self.replica_id),
                recover=self._lost.recoverable,
                batch_size=cadences.BATCH_SIZE,
            )
        metrics.observe_redelivery(done, self.replica_id)
        signals.announce_finished(*done.closed)

    def _connected_producer(self) -> Any:
        """Return the producer, connecting with a short bounded retry (never Celery's 100).

        Raises kombu's OperationalError when the broker cannot be reached, before any claim.
        """
        if "producer" not in self.__dict__:
            self.connection.ensure_connection(
                max_retries=2, interval_start=0, interval_step=0.5, interval_max=1, timeout=5
            )
        return self.producer

    @cached_property
    def connection(self) -> Any:
        """The broker connection this replica publishes on, with bounded timeouts and confirms.

        Connect and socket timeouts are ``cadences.BROKER_TIMEOUT`` seconds (for the transports
        that have them: ``broker_timeout_options``), so a publish to a dead or frozen broker
        raises within seconds instead of holding the claim until the server ends it. On AMQP the
        channel is in confirm mode (``publisher_confirm_options``): a publish returns only once
        the broker accepted the message, so a run is committed dispatched only after that.
        """
        timeout = cadences.BROKER_TIMEOUT
        driver = self.app.connection_for_write().get_transport_cls().driver_type
        return self.app.connection_for_write(
            connect_timeout=timeout,
            transport_options={
                **broker_timeout_options(driver, timeout), **publisher_confirm_options(driver)
            },
        )

    def _publish_batch(self) -> Any:
        """Buffer one claim's publishes: kombu's ``Producer.batch`` (kombu 5.7 and later).

        On Redis the messages then go in pipelines, flushed by the ledger after the first
        ``ledger.FLUSH_EVERY`` runs, then after twice as many each time, and after the last, before the claim's writes and commit;
        transports without batching (and older kombu) publish each message at once and the
        flush does nothing. Leaving the context after an error discards what was not sent.
        """
        batch = getattr(self.producer, "batch", None)
        if batch is None:
            return nullcontext(_Unbuffered())
        return batch()

    def _publisher(self) -> Callable[[Message], None]:
        """``RunPublisher.publish`` on this replica's producer, with the setting it reads taken
        once, for one claim or redelivery pass. Called inside ``_publish_batch``: where the
        transport buffers, each publish only adds to the batch, which the claim flushes."""
        return partial(
            self._runs.publish, self.producer, reject_unknown=conf.reject_unknown_tasks
        )

    def _recovered(self) -> None:
        """Log the end of an outage once, when the database or broker answered again.

        The database's line names the server reached (``host:port``): after a failover, the
        promoted standby.
        """
        where = f", at {self._database_address}" if self._failing == "database" else ""
        logger.warning(
            "%s reachable again after %d failed ticks%s", self._failing, self._failures, where,
            extra={"action": "recovered", "replica": self.replica_id},
        )
        self._failures = 0

    def _failed(self, what: str, exc: Exception) -> float:
        """Log the first failure of an outage (not every tick) and return a capped backoff.

        The database's first line names the server the replica was on (``host:port``).
        """
        self._failures += 1
        self._floor.drop()  # a failover may bring another server's ledger: read it whole
        error = describe(exc)
        if self._failures == 1 or what != self._failing:
            if what == "database":
                where = ledger.server_address() or self._database_address
                error += f" (connected to {where or 'no server yet'})"
            logger.error(
                "%s unavailable, retrying with backoff: %s", what, error,
                extra={"action": f"{what}_down", "replica": self.replica_id},
            )
        else:
            logger.debug("%s still unavailable: %s", what, error)
        self._failing = what
        if what == "database":
            ledger.close_sessions()
        return retry_delay(self._failures, cadences.RETRY_BACKOFF_MAX)

    def _reset_producer(self) -> None:
        """Drop the broker connection so the next publish reconnects."""
        self.__dict__.pop("producer", None)
        broker = self.__dict__.pop("connection", None)
        if broker is not None:
            try:
                broker.release()
            except Exception:  # noqa: BLE001 - already broken
                pass

    @property
    def info(self) -> str:
        return f"    . replica -> {self.replica_id}\n    . run ledger -> scheduling.models.Run"


def next_batch_size(size: int, claimed: int) -> int:
    """The size of a replica's next claim after one of ``size`` that claimed ``claimed`` runs.

    A full claim means a herd (more runs due at once than one claim takes): the next takes twice
    as many, up to ``cadences.HERD_BATCH_SIZE``, so the claim's fixed round trips (the claim
    query, the writes, the commit, the next poll; each waits for a core on a busy machine) are
    paid fewer times; any other claim brings it back to ``cadences.BATCH_SIZE``.
    """
    if claimed < size:
        return cadences.BATCH_SIZE
    return max(cadences.BATCH_SIZE, min(size * 2, cadences.HERD_BATCH_SIZE))


def _session_ended(exc: BaseException) -> bool:
    """Whether ``exc`` says the server ended the session (SQLSTATE class 08, 57P01-57P03, or
    25P03: the idle-in-transaction timeout, which Django raises as an InternalError)."""
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    return state.startswith("08") or state in {"25P03", "57P01", "57P02", "57P03"}


class _Unbuffered:
    """What ``_publish_batch`` gives when the producer cannot buffer: nothing to flush."""

    def flush(self) -> None:
        """Nothing is held back: every publish was sent when it was made."""


@contextmanager
def _stop_signals_deferred() -> Iterator[None]:
    """Hold SIGTERM, SIGINT and SIGQUIT until the claim transaction has ended.

    Celery beat turns SIGTERM into SystemExit wherever the main thread is; between publishing and
    committing that would roll the claim back behind a message already sent. The claim is bounded
    (statement timeout, bounded publish retries), so the stop is only delayed, never lost.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
