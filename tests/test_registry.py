"""The registry validates every call before anything is stored (no I/O here)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities import images_spec, markdown_spec, pdf_spec, registry
from capabilities.schema_patterns import python_pattern

PDF = pdf_spec.SPEC
MARKDOWN = markdown_spec.SPEC
IMAGE = images_spec.SPEC


def code_and_path(spec: registry.CapabilitySpec, params: dict[str, Any]) -> tuple[str, str] | None:
    error = spec.validate(params)
    return None if error is None else (error.code, (error.details or {})["path"])


@pytest.mark.parametrize(
    ("pattern", "python"),
    [
        ("^a$", r"^a\Z"),
        (r"^a\$$", r"^a\$\Z"),  # an escaped dollar stays a dollar
        ("^[$]$", r"^[$]\Z"),  # inside a class it is a character
        ("^(a|b)$|^c$", r"^(a|b)\Z|^c\Z"),
    ],
)
def test_dollar_means_the_end_of_the_text(pattern: str, python: str) -> None:
    assert python_pattern(pattern) == python


@pytest.mark.parametrize("size", ["a4\n", "letter\n", "a4\nx"])
def test_a_trailing_newline_does_not_pass_a_pattern(size: str) -> None:
    params = {"html": "x", "options": {"pageSize": size}}
    assert code_and_path(PDF, params) == ("INVALID_PARAMS", "params.options.pageSize")


def test_margins_with_a_newline_are_refused_by_the_schema_as_by_the_runner() -> None:
    params = {"html": "x", "options": {"margin": "20mm\n"}}
    assert code_and_path(PDF, params) == ("INVALID_PARAMS", "params.options.margin")


@override_settings(ABP={**settings.ABP, "MAX_MARKDOWN_BYTES": 10})
def test_size_limits_come_from_the_settings() -> None:
    assert code_and_path(MARKDOWN, {"markdown": "x" * 10}) is None
    assert code_and_path(MARKDOWN, {"markdown": "x" * 11}) == ("INVALID_PARAMS", "params.markdown")
    # Counted in UTF-8 bytes, not characters.
    assert code_and_path(MARKDOWN, {"markdown": "é" * 6}) == ("INVALID_PARAMS", "params.markdown")
    schema = MARKDOWN.describe()["inputSchema"]
    assert schema["properties"]["markdown"]["maxLength"] == 10


@override_settings(ABP={**settings.ABP, "MAX_IMAGE_BYTES": 300})
def test_base64_is_bounded_by_its_decoded_size_with_line_breaks() -> None:
    limit = registry.SizeLimit(path=("image", "content"), setting="MAX_IMAGE_BYTES", base64=True)
    assert limit.max_length() == 400 + 2 * (400 // 76 + 1)
    lines = "\r\n".join(["QUJD" * 19] * 5)  # 380 characters of base64 in 76-wide lines
    assert code_and_path(IMAGE, {"image": {"content": lines}}) is None
    too_long = {"image": {"content": "QUJD" * 200}}
    assert code_and_path(IMAGE, too_long) == ("INVALID_PARAMS", "params.image.content")


def test_the_size_is_checked_before_the_schema() -> None:
    # Wrong in two ways: the size is what the agent hears about.
    huge = {"html": "x" * (settings.ABP["MAX_HTML_BYTES"] + 1), "colour": "red"}
    error = PDF.validate(huge)
    assert error is not None
    assert error.details == {
        "path": "params.html",
        "rule": "maxLength",
        "limit": settings.ABP["MAX_HTML_BYTES"],
    }


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"markdown": "a\x00"}, "params.markdown"),
        ({"markdown": "\udfff"}, "params.markdown"),
        ({"markdown": "x", "options": {"sanitize\x00": True}}, "params.options"),
    ],
)
def test_text_no_store_can_hold_is_invalid(params: dict[str, Any], path: str) -> None:
    assert code_and_path(MARKDOWN, params) == ("INVALID_PARAMS", path)


def test_deeply_nested_params_are_walked_without_recursion() -> None:
    nested: Any = "\x00"
    for _ in range(5000):
        nested = [nested]
    sleep = registry.CapabilitySpec(
        name="x", description="", input_schema={}, output_schema={}, runner="x"
    )
    error = sleep.validate({"deep": nested})
    assert error is not None
    assert error.code == "INVALID_PARAMS"


@override_settings(ABP={**settings.ABP, "MAX_TIMEOUT_MS": 60_000, "DEFAULT_TIMEOUT_MS": 90_000})
def test_timeouts_stay_within_the_server_s_maximum() -> None:
    assert PDF.timeouts() == registry.Timeouts(default_ms=60_000, max_ms=60_000)
    assert MARKDOWN.timeouts() == registry.Timeouts(default_ms=30_000, max_ms=60_000)
