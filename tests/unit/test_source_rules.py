"""Rules of the source tree, checked by walking it with ``ast``.

- Reasons are ``Run.Reason`` constants: outside ``scheduling/models/`` no code compares a run's
  reason with a string literal (``reason == "..."``, ``reason.startswith("...")``) or passes one
  (``reason="..."``, or a literal in the place of a parameter named ``reason``).
- Tests and benchmarks use public names: no ``from module import _name`` and no
  ``module._name`` of another module (a private name of a test's own module is its business).
- The app and the example project use Django's public API only: no name of the ORM's query
  building (``django.db.models.sql``: the compiler, ``Query``), none of ``django.db.models.query``
  but its public ones (``get_related_populators``, ``RelatedPopulator`` and the iterables are
  internals: ``get_related_populators`` changed its signature in Django 6.1 and broke the claim),
  and no underscore name of any ``django`` module, imported or reached as an attribute.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "scheduling"


def _sources(*folders: Path) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _breaches(
    rule: Callable[[ast.Module], list[tuple[int, str]]], *folders: Path
) -> dict[str, list[tuple[int, str]]]:
    """What ``rule`` finds in each source file under ``folders`` that breaks it."""
    return {
        str(path.relative_to(ROOT)): found
        for path, tree in _sources(*folders)
        if (found := rule(tree))
    }


def _is_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _names_reason(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "reason") or (
        isinstance(node, ast.Attribute) and node.attr == "reason"
    )


def _reason_positions(trees: list[ast.Module]) -> dict[str, int]:
    """Functions of the app with a positional parameter named ``reason``: name -> its index."""
    positions: dict[str, int] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
                if "reason" in names:
                    positions[node.name] = names.index("reason")
    return positions


def reason_literals(tree: ast.Module, positions: dict[str, int]) -> list[tuple[int, str]]:
    """Return (line, what) for each reason compared with or given as a string literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(_names_reason, sides)) and any(map(_is_literal, sides)):
                found.append((node.lineno, "reason compared with a literal"))
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("startswith", "endswith")
                and _names_reason(func.value)
            ):
                found.append((node.lineno, f"reason.{func.attr}(...)"))
            for keyword in node.keywords:
                if keyword.arg == "reason" and _is_literal(keyword.value):
                    found.append((node.lineno, "reason= a literal"))
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            index = positions.get(name)
            if index is not None:
                offset = 1 if isinstance(func, ast.Attribute) and index > 0 else 0  # self
                at = index - offset
                if at < len(node.args) and _is_literal(node.args[at]):
                    found.append((node.lineno, f"a literal reason passed to {name}()"))
    return found


def test_no_reason_is_written_or_compared_as_a_literal_outside_the_model():
    trees = dict(_sources(APP))
    positions = _reason_positions(list(trees.values()))
    breaches = {
        str(path.relative_to(ROOT)): found
        for path, tree in trees.items()
        if path.parent != APP / "models" and "migrations" not in path.parts
        and (found := reason_literals(tree, positions))
    }
    assert breaches == {}


def test_the_reason_rule_catches_each_form():
    positions = {"close": 2, "record": 1}
    tree = ast.parse(
        "if run.reason == 'worker lost': pass\n"
        "ok = run.reason.startswith('misfire: coalesced')\n"
        "runs.update(reason='schedule edited')\n"
        "close(run, status, 'periodic task deleted', now)\n"
        "self.record(f'revoked {n}')\n"
        "close(run, status, Run.Reason.TASK_DELETED, now)\n"
        "runs.update(reason=Run.Reason.SCHEDULE_EDITED)\n"
    )
    assert reason_literals(tree, positions) == [
        (1, "reason compared with a literal"),
        (2, "reason.startswith(...)"),
        (3, "reason= a literal"),
        (4, "a literal reason passed to close()"),
        (5, "a literal reason passed to record()"),
    ]


def _ours(module: str) -> bool:
    """Whether dotted ``module`` is a module or package of this repository."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Return (line, name) for each underscore name taken from another module of ours."""
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(
                (a.asname or a.name).split(".")[0] for a in node.names if _ours(a.name)
            )
        elif isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
                elif _ours(f"{node.module}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_tests_and_benchmarks_use_public_names_only():
    assert _breaches(private_imports, ROOT / "tests", ROOT / "bench") == {}


def test_the_private_name_rule_catches_each_form():
    tree = ast.parse(
        "from scheduling import ledger, guard\n"
        "from scheduling.models import Run\n"
        "from kombu.transport.virtual import base\n"
        "from scheduling.ledger.writes import _insert, insert_runs\n"
        "ledger._claim_due(1)\n"
        "guard.liveness._conn\n"  # an attribute of an object, not a module's name: allowed
        "ledger.claim_and_dispatch\n"
        "Run._meta\n"  # Django's model API, of a class
        "base._private\n"  # not ours
    )
    assert private_imports(tree) == [(4, "scheduling.ledger.writes._insert"), (5, "ledger._claim_due")]


#: The ORM's query building: the compiler, ``Query``, ``where``; every name in it is internal.
DJANGO_INTERNAL_PACKAGE = "django.db.models.sql"
#: What ``django.db.models.query`` documents; its other names are internals.
DJANGO_QUERY_PUBLIC = frozenset({
    "QuerySet", "RawQuerySet", "EmptyQuerySet", "Prefetch", "prefetch_related_objects",
    "aprefetch_related_objects",
})


def _private_django(dotted: str) -> bool:
    """Whether ``dotted`` (``django.x.y``) names something outside Django's public API."""
    parts = dotted.split(".")
    if parts[0] != "django":
        return False
    if any(p.startswith("_") and not p.startswith("__") for p in parts):
        return True
    if dotted == DJANGO_INTERNAL_PACKAGE or dotted.startswith(DJANGO_INTERNAL_PACKAGE + "."):
        return True
    query = ["django", "db", "models", "query"]
    return parts[:4] == query and len(parts) > 4 and parts[4] not in DJANGO_QUERY_PUBLIC


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(names)])


def django_private_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Return (line, dotted name) for each name outside Django's public API that ``tree``
    imports, or reaches as an attribute of a Django module it imported."""
    found = []
    modules: dict[str, str] = {}  # local name -> the Django module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_django(alias.name):
                    found.append((node.lineno, alias.name))
                elif alias.name.split(".")[0] == "django":
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else "django"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "django":
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _private_django(node.module) or _private_django(dotted):
                    found.append((node.lineno, dotted))
                else:
                    modules[alias.asname or alias.name] = dotted
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            root = dotted.split(".")[0] if dotted else ""
            if root in modules:
                full = modules[root] + dotted[len(root):]
                # the outermost attribute, then each shorter chain: the first private one counts
                while "." in full and not _private_django(full):
                    full = full.rsplit(".", 1)[0]
                if _private_django(full):
                    found.append((node.lineno, full))
    return sorted(set(found))


def test_the_app_and_project_use_public_django_names_only():
    assert _breaches(django_private_names, APP, ROOT / "project") == {}


def test_the_django_rule_catches_each_form():
    tree = ast.parse(
        "from django.db.models.query import get_related_populators, QuerySet\n"
        "from django.db.models.sql.compiler import SQLCompiler\n"
        "from django.db.models import sql, query\n"
        "import django.db.models.sql.where\n"
        "from django.utils.functional import _lazy_proxy_unpickle\n"
        "from django.utils import _os\n"
        "import django.db.models.query as q\n"
        "q.RelatedPopulator(info, select, db)\n"
        "q.QuerySet\n"
        "query.ModelIterable\n"
        "from django.utils.translation import gettext_lazy as _\n"  # a public name, aliased
        "from django.db.models import Q, F\n"
        "import django\n"
        "django.db.models.query.get_related_populators(a, b, c)\n"
        "django.setup()\n"
        "Run._meta.get_field('id')\n"  # Django's model API, of a class
        "from kombu.transport.virtual import _private\n"  # not Django
    )
    assert django_private_names(tree) == [
        (1, "django.db.models.query.get_related_populators"),
        (2, "django.db.models.sql.compiler.SQLCompiler"),
        (3, "django.db.models.sql"),
        (4, "django.db.models.sql.where"),
        (5, "django.utils.functional._lazy_proxy_unpickle"),
        (6, "django.utils._os"),
        (8, "django.db.models.query.RelatedPopulator"),
        (10, "django.db.models.query.ModelIterable"),
        (14, "django.db.models.query.get_related_populators"),
    ]


#: Longest function and module of the app, in lines (a function from its ``def`` to its last line).
FUNCTION_LINES = 60
MODULE_LINES = 500


def oversized(tree: ast.Module, lines: int) -> list[tuple[int, str]]:
    """Return (line, what) for the module past MODULE_LINES (``lines`` long) and each function
    past FUNCTION_LINES."""
    found = []
    if lines > MODULE_LINES:
        found.append((1, f"module of {lines} lines"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append((node.lineno, f"{node.name}: {length} lines"))
    return sorted(found)


def test_no_function_of_the_app_over_60_lines_and_no_module_over_500():
    breaches = {}
    for path, tree in _sources(APP):
        where = str(path.relative_to(ROOT))
        found = oversized(tree, len(path.read_text().splitlines()))
        if found:
            breaches[where] = found
    assert breaches == {}


def test_the_size_rule_catches_long_functions_and_modules():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    tree = ast.parse(
        f"def short():\n{body}\n"  # 60 lines: allowed
        f"async def long():\n{body}    return 1\n"  # 61 lines
        f"class A:\n    def method(self):\n{body.replace('    ', '        ')}        return 2\n"
    )
    assert oversized(tree, 500) == [(62, "long: 61 lines"), (124, "method: 61 lines")]
    assert oversized(ast.parse("x = 1\n"), 501) == [(1, "module of 501 lines")]
