"""Django settings of the benchmark's replicas with the built-in prune on: the example project's,
plus ``SCHEDULING_PRUNE_*`` from the environment.

``bench.scale.day_ledger`` sets, per deployment:

- ``BENCH_PRUNE_OLDER_THAN``: seconds (``SCHEDULING_PRUNE_OLDER_THAN``);
- ``BENCH_PRUNE_INTERVAL``: seconds between two prune passes of a replica
  (``SCHEDULING_PRUNE_INTERVAL``).

The batch size and the runs kept per task are the defaults (``scheduling.conf``).
"""

from __future__ import annotations

import os

from project.settings import *

SCHEDULING_PRUNE_OLDER_THAN = float(os.environ["BENCH_PRUNE_OLDER_THAN"])
SCHEDULING_PRUNE_INTERVAL = float(os.environ["BENCH_PRUNE_INTERVAL"])
