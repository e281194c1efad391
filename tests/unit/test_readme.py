"""The README reads at a glance (issue 33, point 6), and its settings show their real defaults.

Its contents list names its section headings in order; it stays within 400 lines; the minimal
install (at most 25 lines) is the section right after the demo and test commands, and names the
scheduler and guard the example deployment runs; it links every docs page. The full settings
reference (docs/configuration.md) lists every ``SCHEDULING_*`` setting. Every relative link and
anchor resolves: tests/unit/test_doc_links.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from celery.utils.imports import symbol_by_name
from django.conf import settings

from scheduling.conf import DEFAULTS
from scheduling.guard import GuardAnnotation
from scheduling.schedulers import LedgerScheduler
from tests.unit.test_doc_links import slug

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "configuration.md"
MAX_LINES = 400
MAX_INSTALL_LINES = 25
COMMANDS = "The demo and the tests"
INSTALL = "Install into an existing project"
CONTENTS = "Contents"
SETTINGS = "Settings"

_ROW = re.compile(r"^\| `SCHEDULING_(\w+)` \|.*\| ([^|]+) \|$", re.MULTILINE)
_ENTRY = re.compile(r"^- \[([^\]]+)\]\(#([^)]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def sections(path: Path = README) -> list[tuple[str, list[str]]]:
    """The page's ``##`` and ``###`` sections in order: (heading text, its lines after the heading
    up to the next such heading, trailing blank lines dropped). Lines in fenced blocks are never
    headings."""
    found: list[tuple[str, list[str]]] = []
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{2,3} (.+)$", line)
        if heading:
            found.append((heading[1], []))
        elif found:
            found[-1][1].append(line)
    return [(heading, "\n".join(body).rstrip().splitlines()) for heading, body in found]


def _section(name: str) -> list[str]:
    return dict(sections())[name]


def _shown(default: object) -> str:
    return f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"


def test_every_setting_is_documented_with_its_default():
    rows = {match[1]: match[2].strip() for match in _ROW.finditer(REFERENCE.read_text())}
    documented = {name: rows.get(name) for name in DEFAULTS}
    assert documented == {name: _shown(s.default) for name, s in DEFAULTS.items()}


def test_readme_settings_are_real_with_their_defaults():
    table = "\n".join(_section(SETTINGS))
    rows = {match[1]: match[2].strip() for match in _ROW.finditer(table)}
    assert len(rows) >= 5, rows
    assert rows == {name: _shown(DEFAULTS[name].default) for name in rows if name in DEFAULTS}


def test_contents_list_the_headings_in_order():
    entries = [match.groups() for line in _section(CONTENTS) if (match := _ENTRY.match(line))]
    headings = [heading for heading, _ in sections() if heading != CONTENTS]
    assert entries == [(heading, slug(heading)) for heading in headings]


def test_contents_reach_pause_and_resume_and_pgbouncer():
    links = dict(_LINK.findall("\n".join(_section(CONTENTS))))
    assert links["Pause and resume"] == "docs/operating.md#pause-and-resume"
    assert links["Behind PgBouncer"] == "docs/configuration.md#behind-pgbouncer"


def test_readme_is_at_most_400_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, len(lines)


def test_minimal_install_comes_right_after_the_two_commands():
    names = [heading for heading, _ in sections()]
    assert names[:2] == [COMMANDS, INSTALL]
    commands = _section(COMMANDS)
    assert [line.split()[:2] for line in commands if line.startswith("./run ")][:2] == [
        ["./run", "demo"], ["./run", "test"],
    ]
    assert "./run test " in (ROOT / ".ci" / "run").read_text()  # the command CI runs
    install = _section(INSTALL)
    assert len(install) + 1 <= MAX_INSTALL_LINES, "\n".join(install)  # + 1: the heading


def test_minimal_install_names_the_scheduler_and_guard_the_deployment_runs():
    text = "\n".join(_section(INSTALL))
    scheduler = re.search(r'^CELERY_BEAT_SCHEDULER = "([^"]+)"$', text, re.MULTILINE)[1]
    guard = re.search(r'^CELERY_TASK_ANNOTATIONS = \["([^"]+)"\]', text, re.MULTILINE)[1]
    assert symbol_by_name(scheduler) is LedgerScheduler
    assert symbol_by_name(guard) is GuardAnnotation
    assert (scheduler, [guard]) == (
        settings.CELERY_BEAT_SCHEDULER, settings.CELERY_TASK_ANNOTATIONS,
    )
    for step in ("pip install ", "python manage.py migrate", " beat ", " worker "):
        assert step in text, step
    assert '"django_celery_beat", "scheduling"' in text


def test_readme_links_every_docs_page():
    linked = {target.partition("#")[0] for _, target in _LINK.findall(README.read_text())}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set()
