"""The convert.markdownToHtml runner and its schemas, with an in-memory context."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from jsonschema import Draft202012Validator

from capabilities.conf import abp_settings
from capabilities.protocol import WireError
from capabilities.work.context import CapabilityError, JobAborted
from capabilities.work.markdown import runner as markdown_html
from capabilities.work.markdown import spec as markdown_spec
from capabilities.work.registry import require
from tests.support.context import RecordingContext

MARKDOWN = require("convert.markdownToHtml")


def convert(markdown: str, **options: Any) -> str:
    """Run the runner on `markdown` with `options`; the HTML."""
    params: dict[str, Any] = {"markdown": markdown}
    if options:
        params["options"] = options
    data = markdown_html.run(params, RecordingContext())
    assert Draft202012Validator(markdown_spec.OUTPUT_SCHEMA).is_valid(data)
    html: str = data["html"]
    return html


def refusal(params: dict[str, Any]) -> CapabilityError:
    """Run the runner, expecting a CapabilityError; the error."""
    assert MARKDOWN.validate(params) is None, "the runner only sees valid params"
    with pytest.raises(CapabilityError) as caught:
        markdown_html.run(params, RecordingContext())
    return caught.value


def wire_refusal(params: dict[str, Any]) -> WireError:
    """The input schema's refusal, which the agent gets before any job is queued."""
    error = MARKDOWN.validate(params)
    assert error is not None
    return error


def limits(**overrides: Any) -> override_settings:
    return override_settings(ABP={**settings.ABP, **overrides})


# --- Markdown ---------------------------------------------------------------------------


@pytest.mark.parametrize("sanitize", [True, False])
def test_headings_and_emphasis(sanitize: bool) -> None:
    html = convert("# Title\n\n## Sub\n\nSome *em*, **strong** and `code`.", sanitize=sanitize)
    assert "<h1>Title</h1>" in html
    assert "<h2>Sub</h2>" in html
    assert "<p>Some <em>em</em>, <strong>strong</strong> and <code>code</code>.</p>" in html


def test_lists() -> None:
    html = convert("- one\n- two\n\n1. first\n2. second\n")
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in html
    assert "<ol>\n<li>first</li>\n<li>second</li>\n</ol>" in html


def test_sane_lists_do_not_mix_list_types() -> None:
    html = convert("1. first\n\n* other\n")
    assert "<ol>\n<li>first</li>\n</ol>" in html
    assert "<ul>\n<li>other</li>\n</ul>" in html


def test_table_keeps_alignment() -> None:
    html = convert("| a | b |\n|:--|--:|\n| 1 | 2 |\n")
    assert "<table>" in html
    assert "<thead>" in html
    assert "<tbody>" in html
    assert '<th style="text-align:left">a</th>' in html
    assert '<td style="text-align:right">2</td>' in html


def test_fenced_code_has_its_language_class() -> None:
    html = convert("```python\nif a < b:\n    pass\n```\n")
    assert '<pre><code class="language-python">if a &lt; b:\n    pass\n</code></pre>' in html


def test_code_classes_other_than_language_are_dropped() -> None:
    html = convert('<pre><code class="language-js evil">x</code></pre>\n\n<p class="x">y</p>')
    assert '<code class="language-js">x</code>' in html
    assert "<p>y</p>" in html


def test_links_keep_href_and_title() -> None:
    html = convert('[site](https://example.com/a?b=1&c=2 "The site") and <https://x.test>')
    assert (
        '<a href="https://example.com/a?b=1&amp;c=2" title="The site" rel="noopener noreferrer">'
        "site</a>"
    ) in html
    assert '<a href="https://x.test" rel="noopener noreferrer">https://x.test</a>' in html


def test_footnotes_keep_their_ids_links_and_classes() -> None:
    html = convert("Text[^1].\n\n[^1]: The note.\n")
    assert '<sup id="fnref:1"><a class="footnote-ref" href="#fn:1"' in html
    assert '<div class="footnote">' in html
    assert '<li id="fn:1">' in html
    assert '<a class="footnote-backref" href="#fnref:1"' in html


def test_other_ids_are_dropped() -> None:
    assert convert("# Title {#login-form}\n") == "<h1>Title</h1>"


def test_abbreviations_and_definition_lists() -> None:
    html = convert("HTML is here.\n\nTerm\n: Definition\n\n*[HTML]: Hyper Text\n")
    assert '<abbr title="Hyper Text">HTML</abbr>' in html
    assert "<dl>\n<dt>Term</dt>\n<dd>Definition</dd>\n</dl>" in html


def test_empty_markdown_is_empty_html() -> None:
    assert convert("") == ""


def test_lone_surrogates_become_replacement_characters() -> None:
    assert convert("a\ud800b") == "<p>a\ufffdb</p>"


# --- Sanitizing -------------------------------------------------------------------------

XSS = {
    "script": ("<script>alert(1)</script>\n\nok", ["<script", "alert(1)"]),
    "onerror": ('<img src="x.png" onerror="alert(1)">', ["onerror", "alert(1)"]),
    "javascript href": ("[click](javascript:alert(1))", ["javascript:", "alert(1)"]),
    "javascript raw href": ('<a href="JaVaScRiPt:alert(1)">x</a>', ["javascript:", "alert"]),
    "iframe": ('<iframe src="https://evil.test">x</iframe>\n\nok', ["<iframe", "evil.test"]),
    "style": ("<style>body { display: none }</style>\n\nok", ["<style", "display"]),
    "attr_list handler": ("# Hi {onclick='alert(1)'}", ["onclick", "alert(1)"]),
    "svg": ('<svg onload="alert(1)"><circle/></svg>', ["<svg", "onload"]),
    "data: image": ("![x](data:text/html,<script>alert(1)</script>)", ["data:", "alert"]),
}


@pytest.mark.parametrize(("markdown", "removed"), XSS.values(), ids=XSS.keys())
def test_sanitize_removes_xss_vectors(markdown: str, removed: list[str]) -> None:
    html = convert(markdown).lower()
    for fragment in removed:
        assert fragment.lower() not in html


def test_sanitize_is_the_default_and_can_be_explicit() -> None:
    markdown = "<script>alert(1)</script>\n\n*ok*"
    assert convert(markdown) == convert(markdown, sanitize=True) == "<p><em>ok</em></p>"


def test_sanitize_keeps_the_safe_part_of_raw_html() -> None:
    html = convert('<img src="x.png" alt="X" onerror="alert(1)">')
    assert html == '<p><img src="x.png" alt="X"></p>'


def test_without_sanitize_raw_html_passes_through() -> None:
    markdown = (
        "<script>alert(1)</script>\n\n"
        '<img src="x.png" onerror="alert(1)">\n\n'
        "[click](javascript:alert(1))\n\n"
        '<iframe src="https://evil.test"></iframe>\n\n'
        "<style>body { display: none }</style>\n"
    )
    html = convert(markdown, sanitize=False)
    assert "<script>alert(1)</script>" in html
    assert 'onerror="alert(1)"' in html
    assert '<a href="javascript:alert(1)">click</a>' in html
    assert '<iframe src="https://evil.test"></iframe>' in html
    assert "<style>body { display: none }</style>" in html


# --- Parameters and limits --------------------------------------------------------------


def test_markdown_over_the_limit_is_refused() -> None:
    with limits(MAX_MARKDOWN_BYTES=10):
        assert convert("x" * 10) == "<p>xxxxxxxxxx</p>"
        error = wire_refusal({"markdown": "x" * 11})
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.markdown", "rule": "maxLength", "limit": 10}


def test_the_limit_counts_utf8_bytes() -> None:
    with limits(MAX_MARKDOWN_BYTES=10):
        error = wire_refusal({"markdown": "é" * 6})  # 6 characters, 12 bytes
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.markdown", "rule": "maxLength", "limit": 10}


def test_the_default_limit_is_one_mib() -> None:
    assert abp_settings().MAX_MARKDOWN_BYTES == 1024 * 1024


# Params the input schema refuses never reach the runner: these are the wire's errors.
@pytest.mark.parametrize(
    ("params", "code", "path"),
    [
        ({}, "MISSING_PARAM", "params.markdown"),
        ({"markdown": 1}, "INVALID_TYPE", "params.markdown"),
        ({"markdown": "x", "options": []}, "INVALID_TYPE", "params.options"),
        (
            {"markdown": "x", "options": {"sanitize": "no"}},
            "INVALID_TYPE",
            "params.options.sanitize",
        ),
    ],
)
def test_bad_params_are_refused(params: dict[str, Any], code: str, path: str) -> None:
    error = wire_refusal(params)
    assert error.code == code
    assert error.details is not None
    assert error.details["path"] == path


def test_markdown_nested_too_deeply_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def recurse(*args: Any, **kwargs: Any) -> str:
        raise RecursionError

    # Real input needs seconds to get there (a list nested ~1000 deep).
    monkeypatch.setattr("markdown.Markdown.convert", recurse)
    error = refusal({"markdown": "- x"})
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.markdown"}


# --- Progress and cancellation ----------------------------------------------------------


def test_checkpoints_and_progress() -> None:
    ctx = RecordingContext()
    markdown_html.run({"markdown": "# Hi"}, ctx)
    assert ctx.checkpoints == 2
    assert ctx.reports == [{"progress": 1, "total": 1, "stage": "convert"}]
    assert ctx.files == {}


@pytest.mark.parametrize("checkpoint", [1, 2])
def test_abort_at_a_checkpoint_raises_job_aborted(checkpoint: int) -> None:
    ctx = RecordingContext(abort_after_checkpoints=checkpoint)
    with pytest.raises(JobAborted):
        markdown_html.run({"markdown": "# Hi"}, ctx)
    assert ctx.checkpoints == checkpoint
    assert ctx.reports == []


# --- Schemas ----------------------------------------------------------------------------


def test_schemas_are_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(markdown_spec.INPUT_SCHEMA)
    Draft202012Validator.check_schema(markdown_spec.OUTPUT_SCHEMA)


@pytest.mark.parametrize(
    "params",
    [
        {"markdown": ""},
        {"markdown": "# Hi"},
        {"markdown": "# Hi", "options": {}},
        {"markdown": "# Hi", "options": {"sanitize": False}},
    ],
)
def test_input_schema_accepts(params: dict[str, Any]) -> None:
    assert Draft202012Validator(markdown_spec.INPUT_SCHEMA).is_valid(params)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"markdown": None},
        {"markdown": 1},
        {"markdown": "x", "extra": 1},
        {"markdown": "x", "options": None},
        {"markdown": "x", "options": {"sanitize": "false"}},
        {"markdown": "x", "options": {"unknown": True}},
    ],
)
def test_input_schema_refuses(params: dict[str, Any]) -> None:
    assert not Draft202012Validator(markdown_spec.INPUT_SCHEMA).is_valid(params)


@pytest.mark.parametrize(
    ("data", "valid"),
    [
        ({"html": "<p>x</p>"}, True),
        ({}, False),
        ({"html": 1}, False),
        ({"html": "", "x": 1}, False),
    ],
)
def test_output_schema(data: dict[str, Any], valid: bool) -> None:
    assert Draft202012Validator(markdown_spec.OUTPUT_SCHEMA).is_valid(data) is valid


def test_spec_names_the_runner() -> None:
    found = MARKDOWN
    assert found.name == "convert.markdownToHtml"
    assert found.warm_up == "capabilities.work.markdown.runner.warm_up"
    assert found.load_runner()({"markdown": "# a"}, RecordingContext()) == {"html": "<h1>a</h1>"}
    found.prepare()  # imports the runner and runs the warm-up
