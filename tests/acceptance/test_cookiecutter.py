"""README.md's "cookiecutter-django and uv" runs top to bottom on a freshly generated project.

The section's first ``sh`` block (the install) is run as written, line after line, in a project
generated from cookiecutter-django by ``tools/try-cookiecutter ... commands FILE``, which then
writes the settings the section names, migrates, runs two beat replicas and a worker with the
section's second block's commands, and fails unless every dispatched run was executed once. Its
order is checked without running anything: the psycopg swap comes before any ``uv add`` of the
app, since ``uv add`` resolves the whole project and fails building ``psycopg[c]`` without
``Python.h``.

The trial needs network access to PyPI (uv, cookiecutter, the template's pins) and took 181 s on
a 2-core machine from a local copy of the template: it runs when
``SCHEDULING_TRY_COOKIECUTTER=1`` is set (the template:
``COOKIECUTTER_TEMPLATE``, a local copy or ``gh:cookiecutter/cookiecutter-django``, the
default).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.acceptance.deployment import ROOT
from tests.unit.test_readme import sections

SECTION = "cookiecutter-django and uv"
SCRIPT = ROOT / "tools" / "try-cookiecutter"
PLACEHOLDER = "/path/to/django-scheduling-ledger"


def blocks() -> list[list[str]]:
    """The section's ``sh`` blocks: each a list of its command lines, comments dropped."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for line in dict(sections())[SECTION]:
        if current is None and line == "```sh":
            current = []
        elif current is not None and line == "```":
            found.append(current)
            current = None
        elif current is not None and (command := re.sub(r"\s+#.*$", "", line).strip()):
            current.append(command)
    return found


def test_the_section_installs_psycopg_binary_before_adding_the_app():
    install, run = blocks()
    assert install == [
        'uv remove psycopg && uv add "psycopg[binary]"',
        f"uv add {PLACEHOLDER}",
    ]
    assert run == [
        "uv run python manage.py migrate",
        (
            "uv run watchfiles --filter python celery.__main__.main"
            " --args '-A config.celery_app beat -l INFO'"
        ),
        "uv run celery -A config.celery_app worker -l INFO",
    ]


def test_the_trial_runs_the_sections_second_block_as_written():
    script = SCRIPT.read_text()
    assert "uv run python manage.py migrate" in script
    assert (
        "uv run watchfiles --filter python \\\n"
        "        celery.__main__.main --args '-A config.celery_app beat -l INFO'"
    ) in script
    assert "uv run celery -A config.celery_app worker -l INFO" in script


@pytest.mark.acceptance
@pytest.mark.once
@pytest.mark.timeout(900)
def test_the_sections_commands_run_in_order_on_a_generated_project(tmp_path):
    if os.environ.get("SCHEDULING_TRY_COOKIECUTTER") != "1":
        pytest.skip(
            "opt-in: about 3 minutes and network access to PyPI; "
            "set SCHEDULING_TRY_COOKIECUTTER=1 to run tools/try-cookiecutter with the README's"
            " commands"
        )
    install, _ = blocks()
    commands = tmp_path / "install.sh"
    commands.write_text("".join(f"{line.replace(PLACEHOLDER, str(ROOT))}\n" for line in install))
    template = os.environ.get("COOKIECUTTER_TEMPLATE", "gh:cookiecutter/cookiecutter-django")
    server = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    done = subprocess.run(
        [str(SCRIPT), template, "commands", str(commands)], capture_output=True, text=True,
        env={**os.environ, "DATABASE_URL": server}, timeout=880, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    assert f"the commands of {commands}, in order:" in done.stderr
    assert re.search(
        r"dispatched (\d+) runs; worker executed \1, \1 distinct; not executed 0;"
        r" ERROR lines in the replicas 0", done.stdout,
    ), done.stdout
