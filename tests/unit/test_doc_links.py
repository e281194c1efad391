"""Every relative link in README.md, CHANGELOG.md and docs/*.md points to an existing file and
heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^[ ]*```.*?^[ ]*```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def _prose(path: Path) -> str:
    """The page without its fenced code blocks and inline code."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", path.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for one heading's text: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_anchors_follow_github():
    assert anchors(ROOT / "docs" / "semantics.md") >= {
        "switching-from-django-celery-beats-databasescheduler",
        "celery_beat_schedule",
        "daylight-saving-time-iscvixie-cron-rule-as-pg_cron",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert broken == []
