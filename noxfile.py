"""The test matrix: one nox session per cell (Python x Django x Celery x django-celery-beat).

- ``main``: Python 3.11, Django 5.2, the newest Celery: the whole suite, as ``./run test`` runs it
  (``.ci/run`` runs ``./run test`` itself for this cell; the session is here to run it alike).
- ``full-py314-django60``: Python 3.14, Django 6.0: the whole suite. ``.ci/run``'s first pass is
  this cell (``./run test`` in ``.venv-py314``); Python 3.14 comes from pyenv or from
  ``tools/get-python3.14`` (``.python3.14/``).
- ``smoke-*``: the other cells, each running ``SMOKE`` below: the lowest Celery and kombu
  declared in pyproject.toml, Django 6.0 on Python 3.12 and 3.13, and django-celery-beat from its
  lowest declared release (2.8) to its newest (2.9).
- ``py313-django61``: Python 3.13, Django 6.1, the whole suite, with Django 6.1 installed past
  django-celery-beat 2.9's ``Django<6.1`` pin as README.md tells a user to until
  django-celery-beat 2.10 (docs/django61.md). Not in ``.ci/run`` (about 40 minutes on this
  machine's two cores: ``nox -s py313-django61``).

Run one cell: ``.venv/bin/nox -s smoke-py313-django60-lowest`` (``./run test`` puts nox into .venv);
every smoke cell: ``nox -t smoke`` (``.ci/run`` runs the lowest-Celery one); list them: ``nox -l``. Arguments after
``--`` replace the cell's pytest arguments. Every cell installs the project with its ``test`` extra plus the cell's pins
in one resolve, so pip's choice is checked against pyproject.toml's ranges.

Interpreters: pyenv's (``~/.pyenv/versions/3.X.*``) when there, otherwise ``python3.X`` on PATH.
Databases: with ``DATABASE_URL`` unset a cell uses an embedded PostgreSQL of its own (data folder
``.data/nox-<cell>``); with it set, a database of its own on that server (the URL's database name
plus the cell's name, created when missing), so cells never share a test database.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import nox

ROOT = Path(__file__).resolve().parent

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

#: The smoke set, the one place it is named: pure logic, real PostgreSQL, the admin pages through
#: the test client (tests/integration/test_admin_pages.py, test_admin.py, test_admin_input.py),
#: one real-process test with three beat replicas (one killed) and a worker, and the wheel
#: installed into a fresh virtualenv beside a generated project (keeping this cell's Django).
SMOKE = (
    "tests/unit",
    "tests/integration",
    "tests/acceptance/test_replicas.py::test_c01_c07_three_replicas_dispatch_every_slot_once",
    "tests/acceptance/test_wheel.py",
)

#: Cells other than main: name -> (Python, pins added to the install of the ``test`` extra).
CELLS: dict[str, tuple[str, tuple[str, ...]]] = {
    # The lowest Celery and kombu declared, on the newest Python and Django.
    "smoke-py313-django60-lowest": (
        "3.13", ("Django~=6.0.0", "celery==5.5.0", "kombu==5.5.2", "django-celery-beat~=2.9.0"),
    ),
    # Django 5.2 with the lowest django-celery-beat declared (2.8 allows Django < 6.0 only).
    "smoke-py312-django52-beat28": ("3.12", ("Django~=5.2.0", "django-celery-beat~=2.8.0")),
    "smoke-py312-django60": ("3.12", ("Django~=6.0.0", "django-celery-beat~=2.9.0")),
}


def interpreter(version: str) -> str:
    """Return pyenv's newest ``python3.X`` for ``version`` ("3.13"), else the one
    ``tools/get-python3.14`` put into ``.python3.X/`` (3.14), else the version for nox."""
    unpacked = ROOT / f".python{version}" / "usr" / "bin" / f"python{version}"
    if unpacked.exists():
        return str(unpacked)
    versions = Path.home() / ".pyenv" / "versions"
    found = sorted(
        (p for p in versions.glob(f"{version}.*") if re.fullmatch(rf"{version}\.\d+", p.name)),
        key=lambda p: int(p.name.rsplit(".", 1)[1]),
    )
    for folder in reversed(found):
        binary = folder / "bin" / f"python{version}"
        if binary.exists():
            return str(binary)
    return version


def _environment(session: nox.Session, cell: str) -> dict[str, str]:
    """Give the cell a database of its own (see the module docstring); return its environment."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        return {"SCHEDULING_DATA_DIR": str(ROOT / ".data" / f"nox-{cell}")}
    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'postgres'}_{cell}".replace("-", "_")
    session.run(
        "python", "-c",
        "import sys, psycopg; from psycopg import sql\n"
        "with psycopg.connect(sys.argv[1], dbname='postgres', autocommit=True) as c:\n"
        "    if not c.execute('SELECT 1 FROM pg_database WHERE datname = %s',"
        " [sys.argv[2]]).fetchone():\n"
        "        c.execute(sql.SQL('CREATE DATABASE {}').format(sql.Identifier(sys.argv[2])))",
        url, name, silent=True,
    )
    return {"DATABASE_URL": urlunsplit(parts._replace(path=f"/{name}"))}


def _pytest(session: nox.Session, cell: str, *args: str) -> None:
    session.run("python", "-m", "pip", "list", "--format=freeze")  # what this cell resolved to
    env = _environment(session, cell)
    try:
        session.run("python", "-m", "pytest", "-ra", "-n", "2", "--dist", "loadfile", *args,
                    env=env)
    finally:
        if "SCHEDULING_DATA_DIR" in env:  # the cell's own embedded server: stop it
            session.run("python", "-c", "from project import embedded; print(embedded.stop())",
                        env=env)


@nox.session(python=interpreter("3.11"), name="main")
def main(session: nox.Session) -> None:
    """Python 3.11, Django 5.2, the newest Celery: the whole suite."""
    session.install("-e", ".[dev]", "Django~=5.2.0")
    _pytest(session, "main", *(session.posargs or ()))


#: Django 6.1, which django-celery-beat's newest release (2.9.0: ``Django<6.1``) does not allow.
DJANGO_61 = "Django~=6.1.0"


@nox.session(python=interpreter("3.13"), name="py313-django61")
def django61(session: nox.Session) -> None:
    """Python 3.13, Django 6.1 past django-celery-beat 2.9's pin: the whole suite."""
    # As docs/django61.md tells a user: everything as pip resolves it (Django 6.0 then), then
    # Django 6.1 alone; pip says django-celery-beat 2.9.0 wants Django<6.1, and installs it.
    session.install("-e", ".[dev]")
    session.install(DJANGO_61)
    session.run("python", "-c", "import django, django_celery_beat; assert django.VERSION[:2]"
                " == (6, 1), django.__version__; print('Django', django.__version__,"
                " 'django-celery-beat', django_celery_beat.__version__)")
    _pytest(session, "py313-django61", *(session.posargs or ()))


@nox.session(python=interpreter("3.14"), name="full-py314-django60")
def full_py314(session: nox.Session) -> None:
    """Python 3.14, Django 6.0, django-celery-beat 2.9: the whole suite."""
    session.install("-e", ".[dev]", "Django~=6.0.0", "django-celery-beat~=2.9.0")
    _pytest(session, "full-py314-django60", *(session.posargs or ()))


def _smoke(cell: str, python: str, pins: tuple[str, ...]) -> None:
    def run(session: nox.Session) -> None:
        session.install("-e", ".[test]", *pins)
        _pytest(session, cell, *(session.posargs or SMOKE))

    run.__doc__ = f"Python {python}, {', '.join(pins)}: the smoke set."
    nox.session(run, python=interpreter(python), name=cell, tags=["smoke"])


for _cell, (_python, _pins) in CELLS.items():
    _smoke(_cell, _python, _pins)
