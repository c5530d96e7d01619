"""Every environment variable the settings read is documented in .env.example."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READS = re.compile(
    r"""(?:_env_\w+|os\.environ\.get|os\.environ\[)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
)


def test_env_example_lists_every_variable_settings_read() -> None:
    read = set(READS.findall((ROOT / "abpsite" / "settings.py").read_text()))
    documented = set(re.findall(r"^#([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert len(read) > 40
    assert sorted(read - documented) == []
