"""The shipped Prometheus alerting rules (``scheduling/prometheus/alerts.yml``) under promtool.

``promtool test rules`` runs ``tests/unit/prometheus/alerts_test.yml``: the overdue gauge from two
replicas gives one alert per task, a counter series that appears with its first overdue run
fires at once, and no replica up fires the critical alert. promtool comes with Debian's
``prometheus`` package (``apt-get install -y prometheus``); without it the test is skipped, except
with the CI variable set, where it fails.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.needs import missing

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "scheduling" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "unit" / "prometheus" / "alerts_test.yml"


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool") or next(
        (place for place in ("/usr/bin/promtool",) if Path(place).exists()), None
    )
    if found is None:
        missing("promtool is missing: install Debian's prometheus (apt-get install -y prometheus)")
    return found


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_file_is_valid(promtool):
    done = _promtool(promtool, "check", "rules", str(RULES))
    assert (done.returncode, done.stdout.split("\n")[1].strip()) == (0, "SUCCESS: 3 rules found")


def test_rule_tests_pass(promtool):
    done = _promtool(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[-1] == "SUCCESS"


def test_a_wrong_expectation_fails(promtool, tmp_path):
    """The rule tests can fail: expecting the overdue alert at minute 4, before the gauge moved."""
    broken = tmp_path / "alerts_test.yml"
    text = RULE_TESTS.read_text().replace("../../../scheduling/prometheus/alerts.yml", str(RULES))
    expected = "exp_alerts: [{exp_labels: {task: digest, severity: warning}}]"
    broken.write_text(text.replace("exp_alerts: []", expected, 1))
    done = _promtool(promtool, "test", "rules", str(broken))
    assert done.returncode == 1
    assert "FAILED" in done.stdout + done.stderr
