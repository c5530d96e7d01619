"""docs/your-capabilities.md as written: its example app is tests/reports, its tests run.

The stack half (the example on every door) is in tests/stack/test_capabilities_stack.py.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from capabilities import CapabilityError
from capabilities.testing import run_capability
from tests.support.paths import ROOT

TUTORIAL = ROOT / "docs" / "your-capabilities.md"


def code_blocks(section: str) -> list[str]:
    text = TUTORIAL.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_the_example_app_is_the_tutorial_s_code() -> None:
    (example,) = code_blocks("A capability in 25 lines")
    assert (ROOT / "tests" / "reports" / "abp_capabilities.py").read_text() == example


def test_the_tutorial_s_tests_pass_as_written() -> None:
    # The first block; the real stack's (conftest.py and a test file) run in a project
    # of their own in tests/testing/test_host_project.py.
    tests, conftest, _ = code_blocks("Testing it")
    assert conftest.startswith("# conftest.py\n")
    namespace: dict[str, object] = {}
    exec(compile(tests, str(TUTORIAL), "exec"), namespace)
    ran = [name for name in namespace if name.startswith("test_")]
    assert ran == [
        "test_squares_reports_progress_and_returns_the_file",
        "test_a_cancel_stops_it_at_the_next_checkpoint",
    ]
    for name in ran:
        test = namespace[name]
        assert callable(test)
        test()


def test_bad_params_get_the_agent_s_error() -> None:
    with pytest.raises(CapabilityError) as refused:
        run_capability("reports.squares", {"rows": "many"})
    assert refused.value.code == "INVALID_TYPE"
    assert refused.value.details == {"path": "params.rows", "rule": "type"}


def test_the_squares_file_is_what_it_says() -> None:
    run = run_capability("reports.squares", {"rows": 3, "title": "T"})
    assert run.result is not None
    assert run.result["csv"]["filename"] == "squares.csv"
    assert run.files["squares.csv"] == b"# T\nn,square\n0,0\n1,1\n2,4"
    assert [(p.progress, p.total, p.stage) for p in run.progress] == [(0, 3, "rows")]
    assert not run.cancelled


@pytest.mark.stack  # a fresh interpreter
def test_the_public_api_imports_nothing_heavy() -> None:
    # The app's package is imported by Django before the apps are ready, and by the web
    # process, which must never load WeasyPrint or Pillow.
    code = (
        "import sys, capabilities;"
        "assert 'capabilities.models' not in sys.modules and 'django.conf' not in sys.modules;"
        "from capabilities import File, JobContext, capability, CapabilityError, JobAborted;"
        "import capabilities.abp_capabilities;"
        "heavy = {'weasyprint', 'PIL', 'markdown', 'capabilities.models'} & set(sys.modules);"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.usefixtures("database")
def test_the_ctx_user_example_exports_each_users_own_notes_and_refuses_without_the_right() -> None:
    """The section's example is tests/notes, as written; two users, their own rows."""
    import uuid

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from tests.notes.models import Note

    (example,) = code_blocks("Whose call it is: `ctx.user` and permissions")
    assert (ROOT / "tests" / "notes" / "abp_capabilities.py").read_text() == example
    view_note = Permission.objects.get(content_type__app_label="notes", codename="view_note")
    users = get_user_model().objects
    ann, bob, eve = (users.create_user(username=f"{n}-{uuid.uuid4().hex[:8]}") for n in "abe")
    for reader in (ann, bob):
        reader.user_permissions.add(view_note)
    Note.objects.bulk_create(
        [
            Note(owner=ann, title="ann 1"),
            Note(owner=ann, title="ann 2"),
            Note(owner=bob, title="bob"),
        ]
    )
    for reader, titles in ((ann, ["ann 1", "ann 2"]), (bob, ["bob"])):
        run = run_capability("notes.export", {}, user=reader)
        assert run.result is not None
        assert run.result["notes"] == len(titles)
        rows = run.files["notes.csv"].decode().splitlines()[1:]
        assert [row.split(",", 1)[1] for row in rows] == titles
    with pytest.raises(CapabilityError, match=r"needs the permission notes\.view_note"):
        run_capability("notes.export", {}, user=eve)
