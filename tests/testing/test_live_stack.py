"""capabilities.testing.live without starting it: what it refuses, and what it asks for.

The stack itself runs in tests/testing/test_host_project.py, for a project of its own and
through the pytest plugin.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from capabilities.testing.live import LiveStack, LiveStackError


def test_without_settings_it_says_which_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    with pytest.raises(LiveStackError, match="DJANGO_SETTINGS_MODULE"):
        LiveStack()


def test_the_client_s_conveniences_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "abp_jobs_client", None)
    stack = LiveStack("mysite.settings", project_dir=tmp_path, run_dir=tmp_path)
    with pytest.raises(LiveStackError, match="pip install abp-jobs-client"):
        stack.call("reports.squares", {})


def test_a_stack_not_started_has_no_key(tmp_path: Path) -> None:
    stack = LiveStack("mysite.settings", project_dir=tmp_path, run_dir=tmp_path)
    with pytest.raises(LiveStackError, match="not running"):
        _ = stack.key


def test_the_defaults_follow_the_settings_package(tmp_path: Path) -> None:
    stack = LiveStack("mysite.settings", project_dir=tmp_path, run_dir=tmp_path)
    assert stack.celery_app == "mysite.celery"
    assert stack.asgi == "mysite.asgi:application"
    assert stack.database == tmp_path / "db.sqlite3"
    assert stack.url == f"ws://127.0.0.1:{stack.web_port}/abp/ws"
