"""Issue 7, acceptance 5: the wheel of ``scheduling`` works in someone else's Django project.

Build the wheel from a copy of the source tree (so the checkout gets no build/ or egg-info),
check it holds the app only (with its migrations and templates, without the development tools
of tools/ or anything of project/, tests/ or bench/), install it with its
dependencies into a fresh virtualenv, generate a minimal project there with ``django-admin
startproject`` plus the install guide's settings, point it at a database of its own created on this
test's PostgreSQL server, then ``migrate`` and ``check`` must exit 0.

The wheel is the one ``python -m build`` makes from its sdist, as a release is built
(docs/development.md, Releasing): both carry pyproject.toml's version, ``twine check --strict``
accepts both, the sdist holds CHANGELOG.md and installs the same files as the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.acceptance.deployment import ROOT

pytestmark = [pytest.mark.acceptance, pytest.mark.once]

SETTINGS = """
INSTALLED_APPS += ["django_celery_beat", "scheduling"]
USE_TZ = True
DATABASES = {{"default": {database!r}}}
CELERY_BEAT_SCHEDULER = "scheduling.schedulers:LedgerScheduler"
CELERY_TASK_ANNOTATIONS = ["scheduling.guard:GuardAnnotation"]
"""


#: Environment variables of this test run that must not reach the fresh project (its settings
#: module, our database and broker, this virtualenv).
_NOT_PASSED = ("DJANGO_", "DATABASE_URL", "CELERY_", "SCHEDULING_", "VIRTUAL_ENV", "PYTHONPATH")
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")
#: The one place the version is written.
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: What a project already has, which installing the wheel must not move.
KEPT = ("Django", "celery", "kombu", "django-celery-beat")
_VERSIONS = (
    "import sys; from importlib.metadata import version\n"
    "print(*(f'{name}=={version(name)}' for name in sys.argv[1:]))"
)


def beat_allows_this_django() -> bool:
    """Whether the installed django-celery-beat declares the installed Django as allowed (not
    so for Django 6.1 and django-celery-beat 2.9.0, installed past its pin: docs/django61.md)."""
    wanted = [Requirement(r) for r in requires("django-celery-beat") or ()]
    return all(
        r.specifier.contains(version("Django"), prereleases=True)
        for r in wanted if r.name.lower() == "django" and r.marker is None
    )


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    """Run a command; return its output, or fail the test with it on a non-zero exit."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)},
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture
def database(empty_database) -> dict[str, object]:
    """The DATABASES entry of an empty database of its own on the test's server."""
    params = empty_database.params
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": empty_database.name,
        "USER": params.get("user") or "",
        "PASSWORD": params.get("password") or "",
        "HOST": params.get("host") or "",
        "PORT": str(params.get("port") or ""),
    }


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """Build the sdist, then the wheel from it (``python -m build``), from a copy of the source
    tree (untracked files too); return (sdist, wheel)."""
    folder = tmp_path_factory.mktemp("dist")
    source = folder / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".venv-*", ".python3.*", ".nox", ".data", "build", "dist", "*.egg-info",
        "__pycache__", "*.whl",
    ))
    _run(sys.executable, "-m", "build", "--outdir", folder / "dist", source, cwd=folder)
    [sdist] = (folder / "dist").glob("*.tar.gz")
    [built] = (folder / "dist").glob("*.whl")
    return sdist, built


@pytest.fixture(scope="module")
def wheel(dists) -> Path:
    """The wheel ``python -m build`` made from the sdist."""
    return dists[1]


def test_both_distributions_carry_the_one_version_and_pass_twine_check(dists):
    sdist, built = dists
    assert (sdist.name, built.name) == (
        f"django_scheduling_ledger-{VERSION}.tar.gz",
        f"django_scheduling_ledger-{VERSION}-py3-none-any.whl",
    )
    metadata = zipfile.ZipFile(built).read(
        f"django_scheduling_ledger-{VERSION}.dist-info/METADATA").decode()
    with tarfile.open(sdist) as archive:
        pkg_info = archive.extractfile(f"django_scheduling_ledger-{VERSION}/PKG-INFO")
        assert pkg_info is not None
        sdist_metadata = pkg_info.read().decode()
    for text in (metadata, sdist_metadata):
        assert [line for line in text.splitlines() if line.startswith("Version: ")] == [
            f"Version: {VERSION}"
        ]
    # names relative to the folder: twine's output wraps at 80 columns
    checked = _run(sys.executable, "-m", "twine", "--no-color", "check", "--strict", built.name,
                   sdist.name, cwd=sdist.parent)
    assert checked.splitlines() == [
        f"Checking {built.name}: PASSED", f"Checking {sdist.name}: PASSED",
    ]


def test_the_sdist_holds_the_changelog_and_installs_what_the_wheel_holds(tmp_path, dists):
    sdist, built = dists
    top = f"django_scheduling_ledger-{VERSION}"
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    assert {f"{top}/CHANGELOG.md", f"{top}/README.md", f"{top}/pyproject.toml"} <= names
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(*PIP, "--python", python, "install", "--quiet", "--no-deps", sdist, cwd=tmp_path)
    assert _run(python, "-c", "import scheduling; print(scheduling.__version__)",
                cwd=tmp_path).strip() == VERSION
    python_dir = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / python_dir / "site-packages"
    installed = {
        path.relative_to(site).as_posix() for path in (site / "scheduling").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    in_wheel = {
        name for name in zipfile.ZipFile(built).namelist()
        if name.startswith("scheduling/") and not name.endswith("/")
    }
    assert installed == in_wheel


def test_wheel_holds_the_app_only(wheel):
    """Every migration, SQL file, template and command of the app; no development tool, nothing
    else.

    The chaos tool and its process helpers (tools/) default to the example project's settings
    and task, which the wheel does not ship: neither they nor project/, tests/ or bench/ are in it.
    """
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"
    # no project/, tools/, tests/ or bench/ entry
    assert {name.split("/")[0] for name in names} == {"scheduling", dist_info}
    assert names & {"scheduling/chaos.py", "scheduling/processes.py"} == set()
    shipped = {  # every migration, template and static file of the source tree
        path.relative_to(ROOT).as_posix()
        for folder in ("migrations", "sql", "templates", "static", "management", "prometheus")
        for path in (ROOT / "scheduling" / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert "scheduling/migrations/0001_initial.py" in shipped
    assert "scheduling/migrations/sql/0001_initial.sql" in shipped  # migration 0001 runs it
    assert "scheduling/sql/schema.sql" in shipped  # the current state, for the tests and readers
    assert "scheduling/templates/admin/scheduling/backfill.html" in shipped
    assert "scheduling/prometheus/alerts.yml" in shipped
    assert shipped - names == set()


def test_wheel_installs_into_a_fresh_project_migrates_and_checks(tmp_path, wheel, database):
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    # The project's own Django, Celery and django-celery-beat first (this test run's versions: a
    # matrix cell's); installing the wheel beside them must keep them. A Django past
    # django-celery-beat's pin goes in last, alone, as docs/django61.md tells a user.
    pins = [f"{name}=={version(name)}" for name in KEPT]
    last = [] if beat_allows_this_django() else [pins[0]]
    first = [pin for pin in pins if pin not in last]
    _run(*PIP, "--python", python, "install", "--quiet", *first, cwd=tmp_path)
    _run(*PIP, "--python", python, "install", "--quiet", wheel, cwd=tmp_path)
    if last:
        _run(*PIP, "--python", python, "install", "--quiet", *last, cwd=tmp_path)
    installed = _run(python, "-c", _VERSIONS, *KEPT, "django-scheduling-ledger",
                     cwd=tmp_path).split()
    assert installed == [*pins, f"django-scheduling-ledger=={VERSION}"]

    site = tmp_path / "site"
    site.mkdir()
    _run(venv / "bin" / "django-admin", "startproject", "mysite", site, cwd=tmp_path)
    settings = site / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + SETTINGS.format(database=database))

    migrated = _run(python, "manage.py", "migrate", "--no-input", cwd=site)
    assert "Applying scheduling.0001_initial... OK" in migrated
    assert "Applying django_celery_beat.0001_initial... OK" in migrated
    assert _run(python, "manage.py", "check", cwd=site).strip() == (
        "System check identified no issues (0 silenced)."
    )
    assert _run(python, "manage.py", "scheduling_status", "--format", "json", cwd=site).strip() \
        == "[]"
    template = "admin/scheduling/backfill.html"
    found = _run(
        python, "manage.py", "shell", "-c",
        f"from django.template import loader; print(loader.get_template({template!r}).origin)",
        cwd=site,
    )
    python_dir = f"python{sys.version_info.major}.{sys.version_info.minor}"
    app = venv / "lib" / python_dir / "site-packages" / "scheduling"
    assert found.splitlines()[-1] == str(app / "templates" / template)
