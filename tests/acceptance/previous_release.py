"""The previous release's code beside today's, for the upgrade tests (``test_upgrade.py``).

``checkout()`` makes a detached git worktree of the previous release's commit from this
repository's own history and removes it afterwards. Its ``manage.py`` and its ``celery`` replicas
and workers run with this test session's Python (the same virtualenv), with the worktree as
their working directory and first on ``PYTHONPATH``: the package an editable install of today's
code maps comes after it on ``sys.path``, so ``import scheduling`` finds the old one
(``code_folder`` shows which a process of that environment imports). The previous release is
the commit CHANGELOG.md's entry for ``PREVIOUS_VERSION`` names, or ``PREVIOUS_COMMIT`` while the
file has no such entry.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from tests.acceptance.deployment import ROOT, Deployment
from tools.processes import Processes

PREVIOUS_VERSION = "1.0.0rc1"
#: The commit of ``PREVIOUS_VERSION`` when CHANGELOG.md does not name one.
PREVIOUS_COMMIT = "1acf5138aae908e7724bd70dfba8771472abf130"


def previous_commit(changelog: Path = ROOT / "CHANGELOG.md") -> str:
    """Return the commit of ``PREVIOUS_VERSION``: the first hexadecimal commit (7 to 40 digits)
    in its CHANGELOG.md section (from its heading to the next heading of that level), else
    ``PREVIOUS_COMMIT``."""
    if not changelog.exists():
        return PREVIOUS_COMMIT
    text = changelog.read_text()
    heading = re.search(
        rf"^(#+)[^\n]*\b{re.escape(PREVIOUS_VERSION)}\b[^\n]*$", text, re.MULTILINE
    )
    if heading is None:
        return PREVIOUS_COMMIT
    level = len(heading.group(1))
    rest = text[heading.end():]
    following = re.search(rf"^#{{1,{level}}}[^#]", rest, re.MULTILINE)
    section = heading.group(0) + (rest[: following.start()] if following else rest)
    commit = re.search(r"(?<![0-9a-f])[0-9a-f]{7,40}(?![0-9a-f])", section)
    return commit.group(0) if commit else PREVIOUS_COMMIT


@contextmanager
def checkout(folder: Path, commit: str | None = None) -> Iterator[Path]:
    """Yield a detached worktree of ``commit`` (default: ``previous_commit()``) at ``folder``;
    remove it (and git's record of it) at the end."""
    commit = commit or previous_commit()
    _git("worktree", "add", "--detach", str(folder), commit)
    try:
        yield folder
    finally:
        _git("worktree", "remove", "--force", str(folder))
        _git("worktree", "prune")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def environment(folder: Path, database_url: str, **env: str) -> dict[str, str]:
    """The environment of a process of the code at ``folder`` on ``database_url``."""
    return {**os.environ, "DATABASE_URL": database_url, "PYTHONPATH": release_path(folder), **env}


def manage_at(folder: Path, database_url: str, *args: str, timeout: float = 180) -> str:
    """Run the ``manage.py`` of the code at ``folder`` (this Python, cwd ``folder``); return its
    output. AssertionError with its stderr when it fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=folder, capture_output=True, text=True,
        env=environment(folder, database_url), timeout=timeout, check=False,
    )
    if done.returncode:
        raise AssertionError(f"manage.py {' '.join(args)} at {folder} failed:\n{done.stderr}")
    return done.stdout


def code_folder(folder: Path, database_url: str) -> Path:
    """Return the folder of the ``scheduling`` package that a process started at ``folder``
    imports, as the replicas and workers started there do (``python -m``, cwd ``folder``)."""
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "--verbosity", "0", "-c",
         "import scheduling; print(scheduling.__file__)"],
        cwd=folder, capture_output=True, text=True, check=True, timeout=120,
        env=environment(folder, database_url, DJANGO_SETTINGS_MODULE="project.settings"),
    )
    return Path(done.stdout.strip()).parent


def old_processes(folder: Path, head: Deployment) -> Processes:
    """Replicas and workers of the code at ``folder``, beside ``head``'s: the same database,
    broker, queue, working folder and execution log (one file: ``head.executions()`` reads the
    executions of both). Each logs the files it imports (``IMPORTS_LOGGED``)."""
    return Processes(
        head.workdir, queue=head.queue, cwd=folder,
        env={**head.env, "PYTHONPATH": release_path(folder), **IMPORTS_LOGGED},
    )


#: A sitecustomize that keeps today's editable install out of an earlier release's processes.
RELEASE_SITE = Path(__file__).with_name("previous_release_site")


def release_path(folder: Path) -> str:
    """``PYTHONPATH`` for a process of the release checked out at ``folder``: its code first,
    and ``RELEASE_SITE``, so no module missing from it comes from today's editable install."""
    return os.pathsep.join((str(folder), str(RELEASE_SITE)))


def query(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on a connection of its own to ``url``; return its rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


#: Python's ``-v`` as an environment variable: a child logs the file of every module it imports.
IMPORTS_LOGGED = {"PYTHONVERBOSE": "1"}


def scheduling_imported_from(processes: Processes, name: str) -> set[Path]:
    """The folders whose ``scheduling`` package process ``name`` imported modules of, read from
    its log (it must have been started with ``IMPORTS_LOGGED``)."""
    text = processes.log_path(name).read_text(errors="replace")
    return {Path(root) for root in re.findall(r"(/[^\s']*?)/scheduling/[\w/]+\.py\b", text)}
