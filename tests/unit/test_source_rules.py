"""Rules of the source tree, checked by walking it with ``ast``.

- Reasons are ``Run.Reason`` constants: outside ``scheduling/models.py`` no code compares a run's
  reason with a string literal (``reason == "..."``, ``reason.startswith("...")``) or passes one
  (``reason="..."``, or a literal in the place of a parameter named ``reason``).
- Tests and benchmarks use public names: no ``from module import _name`` and no
  ``module._name`` of another module (a private name of a test's own module is its business).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "scheduling"


def _sources(*folders: Path) -> Iterator[tuple[Path, ast.Module]]:
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


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
        if path != APP / "models.py" and "migrations" not in path.parts
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
    breaches = {
        str(path.relative_to(ROOT)): found
        for path, tree in _sources(ROOT / "tests", ROOT / "bench")
        if (found := private_imports(tree))
    }
    assert breaches == {}


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
