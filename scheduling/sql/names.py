"""The names the SQL shares with the Python enums, written once: in the enums.

``queries.sql`` and ``schema.sql`` never spell a run status, a reason, a trigger or a policy
name; they write a placeholder that ``fill`` replaces with the enum's value as a SQL literal
when the file is read:

- ``{status.pending}``: ``Run.Status.PENDING``, ``'pending'`` (any member, lower case);
- ``{reason.worker_lost}``: the constant ``Run.Reason.WORKER_LOST``, ``'worker lost'``;
- ``{trigger.schedule}``, ``{overlap.buffer_one}``, ``{misfire.catch_up}``,
  ``{worker_lost.recover}``: ``Run.Trigger`` and ``TaskPolicy``'s ``Overlap``, ``Misfire`` and
  ``WorkerLost``;
- ``{unfinished}`` and ``{final}``: ``Run.UNFINISHED_STATUSES`` and ``Run.FINAL_STATUSES`` as a
  list of literals, for ``IN (...)``; ``{watching}`` and ``{buffering}``: ``TaskPolicy.WATCHING``
  and ``TaskPolicy.BUFFERING``, the same way.

The values stay literals in the statements, so a generic plan still proves a partial index's
predicate. A migration's SQL file holds the filled text (``schema_blocks``), as it ran.
"""

from __future__ import annotations

import re
from functools import cache

#: A placeholder: ``{family.member}`` or ``{list}``.
PLACEHOLDER = re.compile(
    r"\{(?:(status|reason|trigger|overlap|misfire|worker_lost)\.([a-z_]+)"
    r"|(unfinished|final|watching|buffering))\}"
)


def literal(value: str) -> str:
    """``value`` as a SQL string literal (quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


@cache
def literals() -> dict[str, str]:
    """Every placeholder's text (without braces) and its SQL: ``{"status.pending": "'pending'",
    "unfinished": "'dispatched', 'running', 'retrying'", ...}``. Django must be set up."""
    from scheduling.models import Run, TaskPolicy

    families = {
        "status": Run.Status, "trigger": Run.Trigger, "overlap": TaskPolicy.Overlap,
        "misfire": TaskPolicy.Misfire, "worker_lost": TaskPolicy.WorkerLost,
    }
    found = {
        f"{family}.{member.name.lower()}": literal(member.value)
        for family, enum in families.items()
        for member in enum
    }
    found.update(
        (f"reason.{name.lower()}", literal(value))
        for name, value in vars(Run.Reason).items()
        if name.isupper() and isinstance(value, str)
    )
    found["unfinished"] = ", ".join(literal(s) for s in Run.UNFINISHED_STATUSES)
    found["final"] = ", ".join(literal(s) for s in Run.FINAL_STATUSES)
    found["watching"] = ", ".join(literal(p) for p in TaskPolicy.WATCHING)
    found["buffering"] = ", ".join(literal(p) for p in TaskPolicy.BUFFERING)
    return found


def enum_values() -> frozenset[str]:
    """The values a placeholder stands for: what the SQL files must not spell out."""
    from scheduling.models import Run, TaskPolicy

    values = {
        member.value
        for enum in (Run.Status, Run.Trigger, TaskPolicy.Overlap, TaskPolicy.Misfire,
                     TaskPolicy.WorkerLost)
        for member in enum
    }
    values.update(v for n, v in vars(Run.Reason).items() if n.isupper() and isinstance(v, str))
    return frozenset(values)


def fill(text: str) -> str:
    """``text`` with every placeholder replaced by its SQL. Raises KeyError naming a
    placeholder that no enum member answers."""

    def sql(match: re.Match[str]) -> str:
        key = match.group(3) or f"{match.group(1)}.{match.group(2)}"
        try:
            return literals()[key]
        except KeyError:
            raise KeyError(f"no enum member for the SQL placeholder {{{key}}}") from None

    return PLACEHOLDER.sub(sql, text)
