"""Modules are named for what they hold, and no two modules of one package have names that read
as one: a letter apart, or one the other with an ending added (``claim.py`` beside ``claimed.py``
made a reader open both to find a name)."""

from __future__ import annotations

import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The longest ending that makes a name read as another's inflection (claim, claims, claimed).
ENDING = 2


def distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest letters inserted, deleted or replaced from a to b."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def confusable(stems: list[str]) -> list[tuple[str, str]]:
    """The pairs of ``stems`` one letter apart, or one the other plus an ending of at most
    ``ENDING`` letters."""
    return [
        (a, b) for a, b in itertools.combinations(sorted(stems), 2)
        if distance(a, b) == 1 or (b.startswith(a) and len(b) - len(a) <= ENDING)
    ]


def test_no_two_modules_of_a_package_have_confusable_names():
    found = {}
    for package in sorted({p.parent for p in (ROOT / "scheduling").rglob("*.py")}):
        if package.name == "migrations":
            continue  # numbered; their names say what each changed
        stems = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
        if pairs := confusable(stems):
            found[str(package.relative_to(ROOT))] = pairs
    assert found == {}


def test_the_rule_catches_names_a_letter_or_two_apart():
    stems = ["claim", "claimed", "claim_rows", "conf", "cron", "prune", "pause", "run", "runs",
             "rum"]
    assert confusable(stems) == [("claim", "claimed"), ("rum", "run"), ("run", "runs")]
    assert (distance("claim", "claimed"), distance("conf", "cron")) == (2, 2)
