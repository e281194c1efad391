"""Development tools of this repository, run from a checkout; not part of the wheel.

``tools.chaos`` (``python -m tools.chaos``) and ``tools.processes`` default to the example
project (``project.settings``, ``project.tasks.record``), which the wheel does not ship either.
"""
