"""Run statuses grouped into outcomes, each with its colour: one palette for every admin list.

The schedule health chart draws one stacked segment per outcome, and every list of runs shows a
run's status as a badge of its outcome's colour (``status_badge``), so a colour means the same
thing on every page. Colours hold their contrast on the admin's light and dark themes (white
text on the dark ones, dark text on the light ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.html import format_html
from django.utils.safestring import SafeString

from scheduling.models import Run


@dataclass(frozen=True)
class Outcome:
    """One colour of the chart and of the badges: the run statuses it stands for."""

    key: str
    label: str
    statuses: tuple[str, ...]
    colour: str
    text_colour: str = "#fff"


#: Bottom to top in a stacked chart column, left to right in the count columns.
OUTCOMES = (
    Outcome("succeeded", "succeeded", (Run.Status.SUCCEEDED,), "#2e7d32"),
    Outcome("failed", "failed", (Run.Status.FAILED,), "#c62828"),
    Outcome("expired", "expired", (Run.Status.EXPIRED,), "#7b3fa0"),
    Outcome("missed", "missed", (Run.Status.MISSED,), "#e08a00", "#1b1b1b"),
    #: Overlap policy skip, a full buffer, a pause, and a run overlap policy replace ended before
    #: it started (a started run it terminates is failed).
    Outcome("skipped", "skipped", (Run.Status.SKIPPED,), "#5c6f82"),
    Outcome("cancelled", "cancelled", (Run.Status.CANCELLED,), "#a7afb7", "#1b1b1b"),
    Outcome(
        "running", "running",
        (Run.Status.DISPATCHED, Run.Status.RUNNING, Run.Status.RETRYING), "#1f6fb8",
    ),
    #: Waiting for its task's unfinished run (an overlap policy that waits).
    Outcome("buffered", "buffered", (Run.Status.BUFFERED,), "#4aa3a0", "#0b2a2a"),
    Outcome("pending", "pending", (Run.Status.PENDING,), "#8cc4f0", "#0b2a44"),
)
_OUTCOME_OF = {status: outcome for outcome in OUTCOMES for status in outcome.statuses}


def outcome_of(status: str) -> Outcome:
    """Return the outcome of a run status (``Run.Status``); KeyError for an unknown status."""
    return _OUTCOME_OF[status]


def status_badge(status: str) -> SafeString:
    """Return a run status as an HTML badge in its outcome's colour (text: the status itself).

    An unknown status (a row written by a newer version, say) is shown as a grey badge.
    """
    outcome = _OUTCOME_OF.get(status)
    colour, text = (outcome.colour, outcome.text_colour) if outcome else ("#777", "#fff")
    return format_html(
        '<span class="run-badge run-badge-{}" style="background:{};color:{}">{}</span>',
        outcome.key if outcome else "unknown", colour, text, status,
    )
