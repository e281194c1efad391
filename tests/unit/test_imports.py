"""No import cycle among the modules of ``scheduling``.

The module graph is read with ``ast`` from every .py file under scheduling/ (subpackages and
migrations included), never by importing anything. The rules:

- Every import statement counts wherever it stands: at module level, inside a function or a
  method, under ``try``. An import moved into a function hides a cycle from the interpreter at
  import time; it does not remove it. Only ``if TYPE_CHECKING:`` blocks are left out: they never
  run, so a name imported for annotations alone is no edge.
- Only modules of ``scheduling`` are nodes; django, celery, the standard library and every other
  package are ignored. Dynamic imports (``importlib``, dotted paths in strings such as Celery's
  ``task_annotations``) are not seen.
- ``import a.b.c`` and ``from a.b.c import x`` give an edge to ``a.b.c`` and to each package on
  the way (``a.b``'s ``__init__``) that does not contain the importing module: Python runs a
  package's ``__init__`` before its submodules, while the importer's own packages are already
  being imported when it runs.
- ``from pkg import name`` gives an edge to the submodule ``pkg.name`` when there is one, else to
  ``pkg``'s ``__init__`` (a name defined or re-exported there). So inside
  scheduling/ledger/planning.py, ``from scheduling.ledger import claim`` (a submodule) is an edge
  to ``scheduling.ledger.claim``, but ``from scheduling.ledger import x`` (a name the package's
  ``__init__`` re-exports) is an edge to the ``__init__``; when that ``__init__`` imports planning
  this is a cycle: a submodule imports a sibling's names from the sibling, not through the
  package.
- Relative imports (``from . import x``, ``from .planning import y``, ``from .. import z``) are
  resolved against the importing module's package.

A module importing itself is no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SCHEDULING = Path(__file__).resolve().parents[2] / "scheduling"

#: module -> imported module -> where ("path:line" of each import statement)
Graph = dict[str, dict[str, list[str]]]


def import_graph(package_dir: Path) -> Graph:
    """Return the import graph among the modules of the package in ``package_dir``."""
    files = {_module_name(package_dir, path): path for path in sorted(package_dir.rglob("*.py"))}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    graph: Graph = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})
        own_package = module if module in packages else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _runtime_imports(tree):
            for target in _targets(node, own_package, files):
                for imported in _with_packages(target, module, packages):
                    if imported != module:
                        where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
                        edges.setdefault(imported, []).append(where)
    for edges in graph.values():
        for places in edges.values():
            places.sort(key=lambda where: int(where.rpartition(":")[2]))
    return graph


def _module_name(package_dir: Path, path: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree`` except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(
    node: ast.Import | ast.ImportFrom, own_package: str, files: dict[str, Path]
) -> list[str]:
    """The modules of the package that ``node`` imports (outside ones dropped)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = own_package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        names = [
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source
            for alias in node.names
        ]
    found = (_known_prefix(name, files) for name in names)
    return [module for module in found if module]


def _known_prefix(name: str, files: dict[str, Path]) -> str:
    """The longest prefix of dotted ``name`` that is a module of the package, or ""."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in files:
            return candidate
    return ""


def _with_packages(target: str, importer: str, packages: set[str]) -> list[str]:
    """``target`` and the packages above it that Python imports first and ``importer`` is not in."""
    parts = target.split(".")
    above = [".".join(parts[:end]) for end in range(1, len(parts))]
    outside = [p for p in above if p in packages and not f"{importer}.".startswith(f"{p}.")]
    return [*outside, target]


def cycles(graph: Graph) -> list[list[str]]:
    """One shortest cycle (first module repeated at the end) per group of modules in a cycle."""
    return sorted(_shortest_cycle(graph, min(group), group) for group in cycle_groups(graph))


def cycle_groups(graph: Graph) -> list[set[str]]:
    """The strongly connected groups of more than one module: each module in one reaches all."""
    return [group for group in _strongly_connected(graph) if len(group) > 1]


def _strongly_connected(graph: Graph) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _shortest_cycle(graph: Graph, start: str, group: set[str]) -> list[str]:
    """Breadth-first from ``start`` back to it, inside ``group``."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child in group and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a group has one


def describe(graph: Graph, group: set[str]) -> str:
    """A shortest cycle of ``group``, then every import statement between its modules."""
    shortest = " -> ".join(_shortest_cycle(graph, min(group), group))
    lines = [f"{', '.join(sorted(group))} (shortest cycle: {shortest})"]
    for source in sorted(group):
        for target in sorted(set(graph[source]) & group):
            lines.append(f"    {source} imports {target} at {', '.join(graph[source][target])}")
    return "\n".join(lines)


def test_no_import_cycle_among_scheduling_modules():
    graph = import_graph(SCHEDULING)
    assert any(target.startswith("scheduling.ledger") for target in graph["scheduling.schedulers"])
    groups = cycle_groups(graph)
    assert not groups, "import cycles among scheduling modules:\n" + "\n".join(
        describe(graph, group) for group in groups
    )


# The rules above, on small packages written for the purpose.


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {"a.py": "def f():\n    from pkg import b\n", "b.py": "from pkg.a import x\n"},
            [["pkg.a", "pkg.b", "pkg.a"]],
            id="lazy-import-in-a-function",
        ),
        pytest.param(
            {"a.py": "class A:\n    def m(self):\n        import pkg.b\n", "b.py": "import pkg.a\n"},
            [["pkg.a", "pkg.b", "pkg.a"]],
            id="import-in-a-method",
        ),
        pytest.param(
            {"a.py": "from . import b\n", "b.py": "from .a import x\n"},
            [["pkg.a", "pkg.b", "pkg.a"]],
            id="relative",
        ),
        pytest.param(
            {
                "ledger/__init__.py": "from .claim import claim\nfrom .planning import plan\n",
                "ledger/claim.py": "from pkg.ledger import plan\n",
                "ledger/planning.py": "plan = 1\n",
            },
            [["pkg.ledger", "pkg.ledger.claim", "pkg.ledger"]],
            id="sibling-name-through-the-package-init",
        ),
        pytest.param(
            {
                "ledger/__init__.py": "from .claim import claim\nfrom .planning import plan\n",
                "ledger/claim.py": "from pkg.ledger.planning import plan\nfrom . import planning\n",
                "ledger/planning.py": "from pkg.ledger import helpers\n",
                "ledger/helpers.py": "x = 1\n",
            },
            [],
            id="siblings-import-submodules-directly",
        ),
        pytest.param(
            {
                "ledger/__init__.py": "from .planning import plan\n",
                "ledger/planning.py": "from pkg.schedulers import Scheduler\n",
                "schedulers.py": "from pkg.ledger.claim import claim\n",
                "ledger/claim.py": "claim = 1\n",
            },
            [["pkg.ledger", "pkg.ledger.planning", "pkg.schedulers", "pkg.ledger"]],
            id="submodule-import-runs-the-package-init-first",
        ),
        pytest.param(
            {
                "conf/__init__.py": "from ..durations import parse\n",
                "durations.py": "def f():\n    from .conf import conf\n",
            },
            [["pkg.conf", "pkg.durations", "pkg.conf"]],
            id="parent-relative-from-a-package-init",
        ),
        pytest.param(
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
                "b.py": "import django\nfrom pkg import a\n",
            },
            [],
            id="type-checking-only-and-outside-packages-ignored",
        ),
    ],
)
def test_cycle_rules(tmp_path, files, expected):
    assert cycles(import_graph(_package(tmp_path, files))) == expected


def test_the_message_names_every_import_of_the_cycle(tmp_path):
    graph = import_graph(_package(tmp_path, {
        "a.py": "import os\n\n\ndef f():\n    from pkg import b\n", "b.py": "from pkg.a import x\n",
    }))
    assert [describe(graph, group) for group in cycle_groups(graph)] == [(
        "pkg.a, pkg.b (shortest cycle: pkg.a -> pkg.b -> pkg.a)\n"
        "    pkg.a imports pkg.b at pkg/a.py:5\n"
        "    pkg.b imports pkg.a at pkg/b.py:1"
    )]
