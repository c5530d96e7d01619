"""The README's first call runs as written, against the real stack."""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

from tests.support.paths import ROOT
from tests.support.stack import Stack

README = ROOT / "README.md"


def first_call() -> str:
    section = README.read_text().split("## A first call", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_first_call_prints_what_its_comments_say(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ABP_KEY", os.environ["ABP_TEST_AGENT_KEY"])
    code = first_call().replace("ws://127.0.0.1:8000/abp/ws", stack.ws_url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "{'html': '<h1>Hello</h1>'}"
    assert "'cancelled': True" in lines[1]
    assert lines[2] == "CANCELLED"
