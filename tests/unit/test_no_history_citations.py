"""The product's code and docs say what and why, not the history that made them: no issue
number, and no file outside the repository (the team's own notes), is cited in the app, the
example project, the docs, README.md or CHANGELOG.md. History goes to commit messages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where the product's text lives, and which of its files are text to read.
PLACES = (ROOT / "scheduling", ROOT / "project", ROOT / "docs")
FILES = (ROOT / "README.md", ROOT / "CHANGELOG.md")
SUFFIXES = {".py", ".sql", ".md", ".html", ".txt", ".yml", ".yaml", ".js", ".css"}
CITATION = re.compile(
    r"\bissues? \d+|\bissue #?\d+|DESIGN\.md|CASES\.md|STYLE\.md|\.\./shared/", re.IGNORECASE
)


def citations(text: str) -> list[tuple[int, str]]:
    """(line number, what is cited) for each citation of an issue or an outside file."""
    return [
        (number, match.group(0))
        for number, line in enumerate(text.splitlines(), 1)
        for match in CITATION.finditer(line)
    ]


def _texts() -> list[Path]:
    paths = [p for place in PLACES for p in sorted(place.rglob("*")) if p.suffix in SUFFIXES]
    return [*paths, *FILES]


def test_the_product_cites_no_issue_and_no_file_outside_the_repository():
    found = {
        str(path.relative_to(ROOT)): hits
        for path in _texts()
        if (hits := citations(path.read_text(errors="replace")))
    }
    assert found == {}


def test_the_citation_rule_catches_each_form():
    text = (
        "a profile (issue 17's profile)\n"
        "Rules: DESIGN.md \"Time semantics\"\n"
        "see ../shared/CASES.md and issues 3 and 4\n"
        "fixed in Issue #12\n"
        "an issue with the broker, tissue 5\n"  # words, not citations
    )
    assert citations(text) == [
        (1, "issue 17"), (2, "DESIGN.md"), (3, "../shared/"), (3, "CASES.md"), (3, "issues 3"),
        (4, "Issue #12"),
    ]
