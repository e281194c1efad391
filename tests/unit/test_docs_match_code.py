"""The docs say what the code has (issue 34, point 3): docs/architecture.md's module tree lists
every module under scheduling/ and nothing that is gone, and every default of a ``SCHEDULING_*``
setting (or value of an internal cadence, ``cadences.NAME``) quoted in docs/*.md and README.md
is the one scheduling/conf.py (scheduling/cadences.py) declares.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduling import cadences
from scheduling.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = "scheduling/"

#: A tree line: its indentation (two spaces a level) and the path it names, before the description.
_TREE_LINE = re.compile(r"^( *)(\S+)")
#: A row of a settings table (its header "| Setting | ... | Default |"): | `SCHEDULING_X` | ... | `value` |
_ROW = re.compile(r"^\| `SCHEDULING_(\w+)` \|.*\| `([^`|]*)` \|$", re.MULTILINE)
_SETTINGS_TABLE = re.compile(r"^\| Setting \|.*\| Default \|\n(?:\|.*\n?)*", re.MULTILINE)
#: A value quoted right after a name in prose: "`SCHEDULING_X` (60 s", "`cadences.X`, 1 h,",
#: "`SCHEDULING_X` seconds (5)". The unit, when given, is s, ms or h.
_PROSE = re.compile(
    r"`(SCHEDULING_|cadences\.)(\w+)`(?: seconds)?(?: \(|, )(\d+(?:\.\d+)?)(?: ?(ms|s|h)\b)?[,;)]"
)
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "ms": 0.001, "h": 3600.0}


def tree_paths(text: str) -> list[str]:
    """The file paths docs/architecture.md's module tree names under ``scheduling/``, relative to
    the repository (``scheduling/ledger/claim.py``); folders (a name ending in ``/``) only set the
    prefix of the lines indented under them."""
    block = text.split("## Modules", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    folders: list[tuple[int, str]] = []  # (indentation, folder path), innermost last
    inside = False
    for line in block.splitlines():
        match = _TREE_LINE.match(line)
        if not match:
            continue
        indent, name = len(match[1]), match[2]
        if indent == 0:
            inside = name == PACKAGE
            folders = [(0, PACKAGE)] if inside else []
            continue
        if not inside:
            continue
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = folders[-1][1] + name
        if name.endswith("/"):
            folders.append((indent, path))
        else:
            paths.append(path)
    return paths


def modules() -> set[str]:
    """Every Python module under scheduling/ but the empty ``__init__.py`` files."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "scheduling").rglob("*.py")
        if path.stat().st_size > 0 and "__pycache__" not in path.parts
    }


def test_the_tree_reader_follows_folders():
    text = "## Modules\n\n```\nscheduling/   app\n  a.py   x\n  sub/\n    b.py   y\n  c.py\n" \
        "tools/   not read\n  d.py\n```\n"
    assert tree_paths(text) == ["scheduling/a.py", "scheduling/sub/b.py", "scheduling/c.py"]


def test_the_module_tree_lists_every_module_and_nothing_gone():
    listed = tree_paths(ARCHITECTURE.read_text())
    assert sorted({p for p in listed if listed.count(p) > 1}) == [], "listed twice"
    gone = sorted(p for p in listed if not (ROOT / p).is_file())
    missing = sorted(modules() - set(listed))
    assert (missing, gone) == ([], []), "(modules not in the tree, tree entries not in scheduling/)"


def _declared(prefix: str, name: str) -> object:
    if prefix == "cadences.":
        return getattr(cadences, name, "(no such constant)")
    setting = DEFAULTS.get(name)
    return setting.default if setting else "(no such setting)"


def _shown(default: object) -> str:
    return f'"{default}"' if isinstance(default, str) else repr(default)


def quoted_defaults() -> list[tuple[str, str, str, str]]:
    """Every default quoted in the docs: (page:line, name, the docs' value, the declared value),
    from the settings tables (last column) and from prose (a number right after the name)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        where = lambda m: f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"  # noqa: E731
        rows = (row for table in _SETTINGS_TABLE.finditer(text)
                for row in _ROW.finditer(text, table.start(), table.end()))
        for match in rows:
            declared = _shown(_declared("SCHEDULING_", match[1]))
            found.append((where(match), f"SCHEDULING_{match[1]}", match[2], declared))
        for match in _PROSE.finditer(text):
            prefix, name, number, unit = match.groups()
            declared = _declared(prefix, name)
            seconds = float(number) * _UNIT_SECONDS[unit]
            same = isinstance(declared, (int, float)) and float(declared) == seconds
            found.append((
                where(match), f"{prefix}{name}", f"{number} {unit or ''}".strip(),
                # equal values shown alike, so the comparison below reads the difference only
                f"{number} {unit or ''}".strip() if same else _shown(declared),
            ))
    return found


def test_quoted_defaults_are_read_from_tables_and_prose():
    quoted = quoted_defaults()
    names = {name for _, name, _, _ in quoted}
    # The reference table names every setting; the prose quotes at least a few.
    assert {f"SCHEDULING_{name}" for name in DEFAULTS} <= names
    assert len([q for q in quoted if "configuration.md" not in q[0]]) >= 5, quoted


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_quoted_default_is_the_declared_one(page):
    prefix = f"{page.relative_to(ROOT)}:"
    wrong = [
        f"{where} {name}: docs say {said}, declared {declared}"
        for where, name, said, declared in quoted_defaults()
        if where.startswith(prefix) and said != declared
    ]
    assert wrong == []


def test_the_supported_pythons_agree_across_pyproject_readme_and_install():
    """pyproject's classifiers are the versions; README and docs/install.md say the same."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    versions = [
        c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions == ["3.11", "3.12", "3.13", "3.14"]
    install = (ROOT / "docs" / "install.md").read_text()
    row = re.search(r"^\| Python \| (.*?) \| `(.*?)` \|$", install, re.MULTILINE)
    assert row.groups() == (
        ", ".join(versions), f'requires-python = "{project["requires-python"]}"'
    )
    readme = (ROOT / "README.md").read_text()
    assert f"Python {versions[0]} to {versions[-1]}" in readme


def test_the_status_example_has_the_commands_columns():
    """docs/operating.md's scheduling_status table heads the columns the command prints."""
    from scheduling.management.commands.scheduling_status import HEADERS

    text = (ROOT / "docs" / "operating.md").read_text()
    example = text.split("On a terminal 120 columns wide:\n\n```\n", 1)[1].split("```", 1)[0]
    header = next(line for line in example.splitlines() if line.startswith("┃"))
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == list(HEADERS)
    assert {len(line) for line in example.splitlines()[1:]} == {120}
