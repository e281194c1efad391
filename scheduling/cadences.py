"""The internal cadences and bounds of the replicas and workers: constants, not settings.

Each was a ``SCHEDULING_<NAME>`` setting before 0.1.0; none is something a
deployment needs to tune, and each value follows from the others or from a measurement (the
comment above it says which). Setting one of the old names in Django settings is reported by
system check ``scheduling.W003`` and has no effect.

Read them at use time as attributes of this module (``cadences.RECONCILE_INTERVAL``, never
``from scheduling.cadences import RECONCILE_INTERVAL``): a test monkeypatches them, and the
settings module of a spawned test process sets them (``import scheduling.cadences as c;
c.RECONCILE_INTERVAL = 2.0``). Durations are in seconds. Imports nothing, so a settings module
may import it.
"""

from __future__ import annotations

#: Longest sleep between two ticks of a replica (seconds): how long an edit, a run-now request or
#: a new task may wait for the replicas to look. Two polls a second, each one short indexed query,
#: cost an idle replica nothing that shows (docs/benchmarking.md).
MAX_INTERVAL = 0.5

#: Most runs one claim transaction dispatches (and one overdue pass marks): 100 publishes fit
#: well inside IDLE_IN_TRANSACTION_TIMEOUT on a slow broker, and a backlog drains in batches.
BATCH_SIZE = 100

#: Most runs one claim dispatches in a herd (more runs due at once than a claim takes): after a
#: full claim a replica's next claim takes twice as many, up to this, and any claim that was not
#: full brings it back to BATCH_SIZE (schedulers.next_batch_size). A claim's round trips are paid
#: per claim; 800 was slower than 400 in the herd benchmark (one replica held the last 800 runs
#: while the two others sat idle). At or below BATCH_SIZE claims never grow.
HERD_BATCH_SIZE = 400

#: Seconds between a replica's reconcile passes besides the ones edits trigger at once: each pass
#: looks only at what the change log names, so this is a safety net for a missed signal, and it
#: bounds how soon the delivery deadline and a dead worker are acted on (plus their own bounds).
RECONCILE_INTERVAL = 60.0

#: Seconds between reconcile passes that check every periodic task (also done at a replica's
#: start): a safety net under the change log, whose cost grows with the number of tasks.
FULL_RECONCILE_INTERVAL = 3600.0

#: statement_timeout of the scheduler's session (seconds): every statement of the app is an
#: indexed query taking milliseconds; 5 s ends a stuck one well inside a stop's patience.
STATEMENT_TIMEOUT = 5.0

#: idle_in_transaction_session_timeout of the scheduler's session (seconds): how long a frozen
#: replica can hold its claim before the server ends its transaction (invariant 8). Above a
#: publish's worst case, about 3 * BROKER_TIMEOUT (one reconnect), so a live claim never hits it.
IDLE_IN_TRANSACTION_TIMEOUT = 10.0

#: TCP keepalive idle time of the scheduler's and the guard's sessions (seconds); probes every
#: half of it, 3 of them, tcp_user_timeout their sum: the keepalive bound, 11 s
#: (ledger.session.Keepalives, docs/outages.md), the same on both ends.
TCP_KEEPALIVES_IDLE = 5

#: Longest wait between two attempts while the database or the broker is unreachable (seconds;
#: each wait drawn between half and all of its doubling bound): a replica resumes within about
#: this long after an outage ends, without hammering a server that is coming back.
RETRY_BACKOFF_MAX = 3.0

#: Connect and socket timeout of the scheduler's own broker connection (seconds; connect only for
#: the SQL transport): a publish to a dead or frozen broker fails within about three times this
#: (one reconnect), inside IDLE_IN_TRANSACTION_TIMEOUT.
BROKER_TIMEOUT = 2.0

#: Seconds between two heartbeats of a replica (its row in the replicas page; display and health
#: probes only); a replica is shown stale after 3 intervals without a tick. One upsert each.
HEARTBEAT_INTERVAL = 5.0

#: Seconds between two built-in prune passes of a replica (when SCHEDULING_PRUNE_OLDER_THAN is
#: set): runs age by hours or days, so an hourly pass keeps the ledger flat.
PRUNE_INTERVAL = 3600.0

#: Most runs one built-in prune transaction deletes: one batch per idle tick, measured at about
#: 2 ms, so no claim waits long behind it (scheduling.builtin_prune sizes busy batches from it).
PRUNE_BATCH_SIZE = 500

#: Seconds between two overdue passes of a replica (each one bounded UPDATE, outside any claim):
#: a run is reported within its success deadline plus about this long.
OVERDUE_INTERVAL = 1.0
