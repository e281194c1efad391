"""Docs, docstrings and comments name only what exists.

Read in docs/*.md, README.md, CHANGELOG.md and every source, template and SQL file of the app
(its migrations aside: they are history):
- a repository path (``scheduling/ledger/claim.py``, ``tests/unit/...``, ``docs/x.md``; an app
  static file by its static path, ``scheduling/admin.css``) is a file of the repository;
- a name quoted in backticks that starts with the app's package, ``scheduling.x.y``, or with one
  of its modules and a class or constant, ``cadences.MAX_INTERVAL``, ``publisher.RunPublisher``,
  is importable and has that attribute; one that starts with neither names a module that
  imports (``celery.beat``) or one of the objects the docs write about (``request.get``), not a
  module the app no longer has (``retention.BuiltinPrune``);
- a ``SCHEDULING_*`` setting is declared (``conf.DEFAULTS``), listed as removed
  (``conf.REMOVED``) or an environment variable some code reads (the example project's
  ``SCHEDULING_DATA_DIR``), and a system check id ``scheduling.E001`` is one the app registers.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from scheduling.conf import DEFAULTS, REMOVED

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "scheduling"

PATH = re.compile(
    r"(?<![\w/.])((?:scheduling|tests|bench|tools|project|docs)/[\w/.\-]*\w"
    r"\.(?:py|sql|md|html|yml|yaml|css|js|txt))"
)
QUOTED = re.compile(r"`+([A-Za-z_]\w*(?:\.\w+)+)(?:\(\))?`+")
SETTING = re.compile(r"\bSCHEDULING_([A-Z][A-Z0-9_]*[A-Z0-9])\b")
CHECK = re.compile(r"\bscheduling\.([EW]\d{3})\b")
#: Objects, not modules, that the docs quote attributes of, and names of other tools.
OBJECTS = frozenset({
    "app", "basic", "config", "cursor", "env", "key", "loader", "messages", "request", "settings",
    "tasks", "transaction", "uv", "yourapp", "pghistory", "python3", "v1", "vX",
    "virtual",  # kombu.transport.virtual, as the docs shorten it
})
#: A file name: a last part that is an extension.
FILE = re.compile(
    r"\.(?:py|jsonl?|sql|md|html|log|toml|so|ya?ml|txt|cfg|ini|lock|whl|gz|sh|png|\d+)$"
)
#: Non-code names that look dotted: check ids, permissions, the history's session setting.
NOT_CODE = re.compile(r"^scheduling\.(?:[EW]\d{3}|(?:view|add|change|delete)_\w+|actor)$")


def _modules() -> dict[str, list[str]]:
    """Each module's last name and the dotted modules that have it."""
    found: dict[str, list[str]] = {}
    for path in APP.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.setdefault(parts[-1], []).append(".".join(parts))
    return found


MODULES = _modules()


def _resolves(module: str, attributes: list[str]) -> bool:
    """Whether ``module`` imports and has the chain of ``attributes`` (or a longer module path
    made of their first ones does)."""
    for split in range(len(attributes), -1, -1):
        try:
            obj = importlib.import_module(".".join([module, *attributes[:split]]))
        except ImportError:
            continue
        for attribute in attributes[split:]:
            if not hasattr(obj, attribute):
                break
            obj = getattr(obj, attribute)
        else:
            return True
    return False


def quoted_name_exists(name: str) -> bool | None:
    """Whether a quoted dotted ``name`` names something of the app; None when it is not one the
    rule reads (another library's, an instance's attribute, a file name, a private name)."""
    first, *rest = name.split(".")
    if NOT_CODE.match(name) or any(part.startswith("_") for part in rest) or FILE.search(name):
        return None
    if first == "scheduling":
        return _resolves("scheduling", rest)
    if first in MODULES:
        if not rest[0][:1].isupper():
            return None  # a function or an instance's attribute: too often a variable's
        return any(_resolves(module, rest) for module in MODULES[first])
    if first in OBJECTS or not first[:1].islower():
        return None
    return importlib.util.find_spec(first) is not None


def environment_names() -> set[str]:
    """The ``SCHEDULING_*`` names the code of the repository quotes as strings (environment
    variables: ``os.environ.get("SCHEDULING_DATA_DIR")``)."""
    return {
        name
        for folder in ("scheduling", "project", "tools", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
        for name in re.findall(r"[\"']SCHEDULING_([A-Z0-9_]+)[\"']", path.read_text())
    }


def check_ids() -> set[str]:
    return {m for p in APP.rglob("*.py") for m in re.findall(r'id="scheduling\.([EW]\d{3})"',
                                                             p.read_text())}


def _texts() -> Iterator[tuple[Path, str]]:
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    suffixes = {".py", ".sql", ".html", ".js", ".css", ".yml"}
    sources = [
        p for p in sorted(APP.rglob("*")) if p.suffix in suffixes and "migrations" not in p.parts
    ]
    for path in [*pages, *sources]:
        yield path, path.read_text()


def _exists(path: str) -> bool:
    return (ROOT / path).exists() or (APP / "static" / path).exists()


def stale(text: str, ids: set[str], settings: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each path, quoted name, setting or check id of ``text`` that is gone."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, p) for p in PATH.findall(line) if "*" not in p and not _exists(p)]
        found += [(number, n) for n in QUOTED.findall(line) if quoted_name_exists(n) is False]
        found += [(number, f"SCHEDULING_{s}") for s in SETTING.findall(line) if s not in settings]
        found += [(number, f"scheduling.{c}") for c in CHECK.findall(line) if c not in ids]
    return found


def test_docs_and_code_name_only_what_exists():
    ids = check_ids()
    settings = set(DEFAULTS) | {removed.name for removed in REMOVED} | environment_names()
    found = {
        str(path.relative_to(ROOT)): hits
        for path, text in _texts()
        if (hits := stale(text, ids, settings))
    }
    assert found == {}


def test_the_rule_catches_each_kind_of_stale_name():
    text = (
        "the prune (`retention.BuiltinPrune`) and `cadences.MAX_INTERVAL`\n"
        "see scheduling/ledger/claimed.py and scheduling/ledger/claim.py\n"
        "set `SCHEDULING_NOT_A_SETTING` or `SCHEDULING_DELIVERY_TIMEOUT`\n"
        "scheduling.E999 and scheduling.E001; `publisher.RunPublisher`, `publisher.Gone`\n"
        "`scheduling.ledger.claim_and_dispatch`, `scheduling.ledger.nothing`, `lost.recoverable`\n"
        "`retention.BuiltinPrune`, `celery.beat`, `request.get`, `faults.log`, `schema.sql`\n"
    )
    settings = set(DEFAULTS)
    assert stale(text, {"E001"}, settings) == [
        (1, "retention.BuiltinPrune"),
        (2, "scheduling/ledger/claimed.py"),
        (3, "SCHEDULING_NOT_A_SETTING"),
        (4, "publisher.Gone"),
        (4, "scheduling.E999"),
        (5, "scheduling.ledger.nothing"),
        (6, "retention.BuiltinPrune"),
    ]
