"""Loaded by the children that run an earlier release's code (``previous_release``): that
release's modules, and none of today's.

An editable install of this checkout (``pip install -e``, as ``./run test`` makes) adds a finder
that maps each module of ``scheduling`` to this checkout, so a child running an earlier release
from its own folder imports from today's code every module that release lacks (Django's template
engine looks for ``scheduling.templatetags``, say). Run after site-packages' ``.pth`` files, this
removes the finder: each module then comes from the release's folder, or it does not exist.
"""

import sys

_OURS = "__editable___django_scheduling_ledger_"


def _ours(thing: object) -> bool:
    owner = getattr(thing, "__self__", thing)
    return getattr(owner, "__module__", "").startswith(_OURS)


sys.meta_path[:] = [finder for finder in sys.meta_path if not _ours(finder)]
sys.path_hooks[:] = [hook for hook in sys.path_hooks if not _ours(hook)]
sys.path[:] = [entry for entry in sys.path if "__editable__.django_scheduling_ledger" not in entry]
