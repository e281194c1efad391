"""The app uses only public names of the stack it extends: Celery, kombu, py-amqp and
django-celery-beat (Django has its own, stricter rule in ``test_source_rules``).

Two forms are caught, walking ``scheduling/`` with ``ast``:
- an import of an underscore name, or from an underscore module, of those packages;
- an attribute ``x._name`` whose name the app never defines itself (as a function, class,
  variable, argument or assigned attribute): it can only be another library's private name,
  reached on one of its objects (``producer.connection._reraise_as_library_errors()``,
  ``task._get_exec_options()``). Names the libraries document as public despite the underscore
  are allowed: Django's ``Model._meta`` API and the named tuple methods.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "scheduling"

STACK = frozenset({"celery", "kombu", "amqp", "django_celery_beat"})
#: Underscore names that are public API: Django's Model ``_meta`` (docs: "Model _meta API") and
#: ``_default_manager`` (docs: "Managers", default managers), ``collections.namedtuple``'s
#: ``_fields``, ``_replace``, ``_asdict`` and ``_make``.
DOCUMENTED = frozenset({"_meta", "_default_manager", "_fields", "_replace", "_asdict", "_make"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_names(trees: Iterable[ast.Module]) -> set[str]:
    """Every name the given modules define or bind: functions, classes, variables, arguments,
    assigned attributes, import aliases."""
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                found.add(node.attr)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                found.update((a.asname or a.name).split(".")[0] for a in node.names)
    return found


def stack_private_names(tree: ast.Module, own: set[str]) -> list[tuple[int, str]]:
    """Return (line, name) for each private name of the stack that ``tree`` imports or reaches
    as an attribute; ``own`` holds the names the app defines itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in STACK and any(_private(p) for p in parts):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] not in STACK:
                continue
            for alias in node.names:
                if any(_private(p) for p in [*parts, alias.name]):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr not in own
            and node.attr not in DOCUMENTED
        ):
            found.append((node.lineno, node.attr))
    return sorted(set(found))


def test_the_app_uses_public_names_of_celery_kombu_and_django_celery_beat_only():
    sources = {path: ast.parse(path.read_text()) for path in sorted(APP.rglob("*.py"))}
    own = defined_names(sources.values())
    breaches = {
        str(path.relative_to(ROOT)): found
        for path, tree in sources.items()
        if (found := stack_private_names(tree, own))
    }
    assert breaches == {}


def test_the_stack_rule_catches_each_form():
    tree = ast.parse(
        "from celery.app.amqp import task_message\n"
        "from celery.utils.time import _naive\n"
        "from kombu._private import thing\n"
        "import celery._state\n"
        "from django_celery_beat.schedulers import ModelEntry\n"
        "ModelEntry._unpack_options(queue='q')\n"
        "producer.connection._reraise_as_library_errors()\n"
        "task_type._get_exec_options()\n"
        "self._runs.publish()\n"  # the app's own attribute
        "Run._meta.get_field('id')\n"  # Django's documented model API
        "row._replace(status='x')\n"  # a named tuple's
        "from scheduling._x import y\n"  # the app's own modules: test_source_rules' business
    )
    own = defined_names([ast.parse("self._runs = 1\n")])
    assert stack_private_names(tree, own) == [
        (2, "celery.utils.time._naive"),
        (3, "kombu._private.thing"),
        (4, "celery._state"),
        (6, "_unpack_options"),
        (7, "_reraise_as_library_errors"),
        (8, "_get_exec_options"),
    ]
