"""Django settings of the benchmark's replicas with the built-in prune on: the example project's,
plus the built-in prune's age and cadence from the environment.

``bench.scale.day_ledger`` sets, per deployment:

- ``BENCH_PRUNE_OLDER_THAN``: seconds (``SCHEDULING_PRUNE_OLDER_THAN``);
- ``BENCH_PRUNE_INTERVAL``: seconds between two prune passes of a replica
  (``scheduling.cadences.PRUNE_INTERVAL``, set on the module).

The batch size and the runs kept per task are the defaults (``scheduling.cadences``,
``scheduling.conf``).
"""

from __future__ import annotations

import os

import scheduling.cadences
from project.settings import *

SCHEDULING_PRUNE_OLDER_THAN = float(os.environ["BENCH_PRUNE_OLDER_THAN"])
scheduling.cadences.PRUNE_INTERVAL = float(os.environ["BENCH_PRUNE_INTERVAL"])
