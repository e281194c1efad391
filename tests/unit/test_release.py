"""The release's metadata cannot drift: the version is written once (pyproject.toml), the
classifiers and requires-python name the matrix noxfile.py runs, and CHANGELOG.md has an entry
for this version and names the previous release's commit."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import scheduling

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]
#: The previous release, 1.0.0rc1: this commit of the repository (the upgrade tests check it out).
PREVIOUS = ("1.0.0rc1", "1acf513")


def matrix(source: str) -> tuple[set[str], set[str]]:
    """(Python versions, Django versions) of the nox sessions in ``source`` (noxfile.py's text):
    each ``interpreter("3.X")``, each cell's Python in ``CELLS`` and each ``Django~=X.Y.0`` pin."""
    pythons: set[str] = set()
    djangos: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "interpreter":
            if isinstance(node.args[0], ast.Constant):  # not _smoke's, which CELLS gives
                pythons.add(node.args[0].value)
        elif isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "CELLS":
            pythons.update(cell[0] for cell in ast.literal_eval(node.value).values())
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            pin = re.fullmatch(r"Django~=(\d+\.\d+)\.0", node.value)
            djangos.update([pin[1]] if pin else [])
    return pythons, djangos


def classified(prefix: str) -> set[str]:
    """The versions of pyproject.toml's classifiers ``<prefix> :: X.Y``."""
    return {
        found[1] for classifier in PROJECT["classifiers"]
        if (found := re.fullmatch(rf"{re.escape(prefix)} :: (\d+\.\d+)", classifier))
    }


def test_the_matrix_reader_finds_each_form():
    source = (
        'CELLS: dict[str, tuple[str, tuple[str, ...]]] = {"a": ("3.12", ("Django~=6.0.0",))}\n'
        'DJANGO_61 = "Django~=6.1.0"\n'
        'nox.session(run, python=interpreter(python))\n'
        '@nox.session(python=interpreter("3.11"))\n'
        'def main(session):\n    session.install("-e", ".", "Django~=5.2.0", "celery==5.5.0")\n'
    )
    assert matrix(source) == ({"3.11", "3.12"}, {"5.2", "6.0", "6.1"})


def test_the_classifiers_name_the_tested_matrix():
    pythons, djangos = matrix((ROOT / "noxfile.py").read_text())
    assert (pythons, djangos) == ({"3.11", "3.12", "3.13", "3.14"}, {"5.2", "6.0", "6.1"})
    assert classified("Programming Language :: Python") == pythons
    assert classified("Framework :: Django") == djangos
    assert PROJECT["requires-python"] == f">={min(pythons, key=lambda v: int(v.split('.')[1]))}"


def test_a_release_candidate_is_beta():
    statuses = [c for c in PROJECT["classifiers"] if c.startswith("Development Status ::")]
    assert statuses == ["Development Status :: 4 - Beta"]
    assert re.fullmatch(r"\d+\.\d+\.\d+rc\d+", VERSION)


def test_the_version_is_written_once_and_read_from_the_metadata():
    assert scheduling.__version__ == VERSION
    written = [
        path.relative_to(ROOT).as_posix() for path in (ROOT / "scheduling").rglob("*.py")
        if VERSION in path.read_text()
    ]
    assert written == []


def test_the_changelog_has_this_release_and_names_the_previous_ones_commit():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", changelog, re.MULTILINE)
    assert [version for version, _ in versions][:3] == ["Unreleased", VERSION, PREVIOUS[0]]
    previous = changelog.split(f"## [{PREVIOUS[0]}]", 1)[1].split("\n## [", 1)[0]
    assert f"ommit `{PREVIOUS[1]}` of this repository." in previous
    assert "### Upgrading" in changelog.split(f"## [{VERSION}]", 1)[1].split("\n## [", 1)[0]


def test_the_install_guide_pins_this_version():
    guide = (ROOT / "docs" / "install.md").read_text()
    assert re.findall(r"django-scheduling-ledger==([\w.]+)", guide) == [VERSION]
    assert re.findall(r"tag \(`v([\w.]+)`\)", guide) == [VERSION]
