"""The built-ins follow their extras: registered where the libraries are, named by
`manage.py check` where they are not (docs/installing.md#extras)."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import pytest
from django.core import checks

from capabilities import abp_capabilities
from capabilities.checks import built_ins_switched_off
from capabilities.work import extras, registry

NAMES = {"export.pdf", "process.image", "convert.markdownToHtml"}


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """`find_spec` finds none of `modules`, as in a venv without their extra."""

    def without(name: str, *args: Any) -> Any:
        return None if name in modules else find_spec(name, *args)

    monkeypatch.setattr(extras, "find_spec", without)


def test_with_every_extra_installed_every_built_in_is_registered_and_check_is_quiet() -> None:
    assert set(extras.BUILT_INS) == NAMES
    assert {spec.name for spec in registry.all_specs()} >= NAMES
    assert extras.switched_off() == []
    assert built_ins_switched_off() == []


def test_a_built_in_whose_extra_is_missing_is_off_and_check_says_how_to_turn_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "weasyprint", "markdown")
    assert [built_in.name for built_in in extras.switched_off()] == [
        "export.pdf",
        "convert.markdownToHtml",
    ]
    assert extras.installed("process.image")
    messages = built_ins_switched_off()
    assert [message.id for message in messages] == ["capabilities.I001"] * 2
    assert all(message.level == checks.INFO for message in messages)
    assert messages[0].msg == (
        "The built-in capability 'export.pdf' is off: the 'pdf' extra is not installed "
        "(weasyprint not found)."
    )
    assert messages[0].hint == 'To serve it: pip install "abp-jobs[pdf]"'
    assert messages[1].hint == 'To serve it: pip install "abp-jobs[markdown]"'


def test_the_declaration_of_a_built_in_without_its_extra_registers_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "PIL")
    declared: list[str] = []

    def capability(name: str, **_: Any) -> Any:
        declared.append(name)
        return lambda function: function

    monkeypatch.setattr(abp_capabilities, "capability", capability)

    def function(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {}

    assert abp_capabilities.built_in("process.image", description="x")(function) is function
    assert abp_capabilities.built_in("export.pdf", description="x")(function) is function
    assert declared == []  # Pillow is in both extras: neither is declared
    assert (
        abp_capabilities.built_in("convert.markdownToHtml", description="x")(function) is function
    )
    assert declared == ["convert.markdownToHtml"]
