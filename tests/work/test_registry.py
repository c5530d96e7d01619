"""The registry validates every call before anything is stored (no I/O here)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities.conf import abp_settings
from capabilities.work import registry
from capabilities.work.images import spec as images_spec
from capabilities.work.schema_patterns import python_pattern

PDF = registry.require("export.pdf")
MARKDOWN = registry.require("convert.markdownToHtml")
IMAGE = registry.require("process.image")


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


def side_maxima(spec: registry.CapabilitySpec) -> dict[tuple[str, str], int]:
    """Each operation's side or offset parameter's maximum, in the manifest's schema."""
    variants = spec.describe()["inputSchema"]["properties"]["operations"]["items"]["oneOf"]
    return {
        (variant["title"], name): schema["maximum"]
        for variant in variants
        for name, schema in variant["properties"].items()
        if name in ("width", "height", "left", "top")
    }


def test_a_setting_can_lower_a_schema_maximum() -> None:
    resize = {"image": {"content": "QUJD"}, "operations": [{"type": "resize", "width": 9000}]}
    assert code_and_path(IMAGE, resize) is None
    assert set(side_maxima(IMAGE).values()) == {images_spec.SCHEMA_MAX_DIMENSION}
    with override_settings(ABP={**settings.ABP, "MAX_IMAGE_DIMENSION": 8000}):
        assert code_and_path(IMAGE, resize) == ("INVALID_PARAMS", "params.operations[0].width")
        maxima = side_maxima(IMAGE)
        assert set(maxima.values()) == {8000}
        assert len(maxima) == 8  # resize, thumbnail: width, height; crop: all four
    # The module's schema is untouched, and so are parameters that are not sides.
    assert code_and_path(IMAGE, resize) is None
    rotate = images_spec.OPERATIONS[3]["properties"]["degrees"]
    assert rotate["maximum"] == 360


def test_a_larger_setting_keeps_the_schemas_own_maximum() -> None:
    too_wide = {"image": {"content": "QUJD"}, "operations": [{"type": "resize", "width": 16385}]}
    with override_settings(ABP={**settings.ABP, "MAX_IMAGE_DIMENSION": 50_000}):
        assert set(side_maxima(IMAGE).values()) == {images_spec.SCHEMA_MAX_DIMENSION}
        assert code_and_path(IMAGE, too_wide) == ("INVALID_PARAMS", "params.operations[0].width")


def test_the_size_is_checked_before_the_schema() -> None:
    # Wrong in two ways: the size is what the agent hears about.
    huge = {"html": "x" * (abp_settings().MAX_HTML_BYTES + 1), "colour": "red"}
    error = PDF.validate(huge)
    assert error is not None
    assert error.details == {
        "path": "params.html",
        "rule": "maxLength",
        "limit": abp_settings().MAX_HTML_BYTES,
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
