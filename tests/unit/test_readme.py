"""The README's settings reference lists every SCHEDULING_* setting with its real default."""

from __future__ import annotations

import re
from pathlib import Path

from scheduling.conf import DEFAULTS

README = Path(__file__).resolve().parents[2] / "README.md"


def _shown(default: object) -> str:
    return f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"


def test_every_setting_is_documented_with_its_default():
    rows = {
        match[1]: match[2].strip()
        for match in re.finditer(r"^\| `SCHEDULING_(\w+)` \|.*\| ([^|]+) \|$", README.read_text(),
                                 re.MULTILINE)
    }
    documented = {name: rows.get(name) for name in DEFAULTS}
    assert documented == {name: _shown(s.default) for name, s in DEFAULTS.items()}
