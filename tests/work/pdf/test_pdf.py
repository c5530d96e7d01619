"""The export.pdf runner, with an in-memory context: no Celery, Redis or DB."""

from __future__ import annotations

import io
import logging
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from jsonschema import Draft202012Validator
from pypdf import PdfReader

from capabilities.conf import abp_settings
from capabilities.protocol import WireError
from capabilities.work.context import CapabilityError, JobAborted
from capabilities.work.pdf import runner as pdf
from capabilities.work.pdf import spec as pdf_spec
from capabilities.work.registry import require
from tests.support.context import RecordingContext
from tests.work.pdf.test_fetcher import (
    data_url,
    image,
    png_header,
    real_font,
    woff2_bomb,
    woff_bomb,
)

# A 1x1 transparent PNG.
PNG_DATA_URL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)

PDF = require("export.pdf")


def pages_html(count: int, head: str = "") -> str:
    """A document of `count` pages, one forced page break between each."""
    style = "<style>.page { page-break-after: always } .page:last-child { page-break-after: auto }"
    body = "".join(f'<div class="page">Page {number}</div>' for number in range(1, count + 1))
    return f"{style}</style>{head}{body}"


def render(params: dict[str, Any], ctx: RecordingContext | None = None) -> PdfReader:
    """Run the runner; the saved PDF, parsed."""
    ctx = ctx or RecordingContext()
    data = pdf.run(params, ctx)
    return PdfReader(io.BytesIO(ctx.files[data["document"]["$file"]]))


def refusal(params: dict[str, Any], ctx: RecordingContext | None = None) -> CapabilityError:
    """Run the runner, expecting a CapabilityError; the error."""
    assert PDF.validate(params) is None, "the runner only sees valid params"
    with pytest.raises(CapabilityError) as caught:
        pdf.run(params, ctx or RecordingContext())
    return caught.value


def wire_refusal(params: dict[str, Any]) -> WireError:
    """The input schema's refusal, which the agent gets before any job is queued."""
    error = PDF.validate(params)
    assert error is not None
    return error


def limits(**overrides: Any) -> override_settings:
    return override_settings(ABP={**settings.ABP, **overrides})


def test_renders_three_pages() -> None:
    ctx = RecordingContext()
    data = pdf.run({"html": pages_html(3)}, ctx)
    assert data["pageCount"] == 3
    document = data["document"]
    assert document["mimeType"] == "application/pdf"
    assert document["filename"] == "document.pdf"
    content = ctx.files[document["$file"]]
    assert content.startswith(b"%PDF-")
    assert document["size"] == len(content)
    reader = PdfReader(io.BytesIO(content))
    assert [page.extract_text() for page in reader.pages] == ["Page 1", "Page 2", "Page 3"]


def test_content_is_an_alias_of_html() -> None:
    assert len(render({"content": pages_html(2)}).pages) == 2


@pytest.mark.parametrize(
    ("options", "size"),
    [
        ({}, (595.28, 841.89)),
        ({"pageSize": "a4"}, (595.28, 841.89)),
        ({"pageSize": "letter"}, (612, 792)),
        ({"pageSize": "Legal"}, (612, 1008)),
        ({"pageSize": "LETTER", "landscape": True}, (792, 612)),
        ({"landscape": True}, (841.89, 595.28)),
    ],
)
def test_page_size_and_orientation(options: dict[str, Any], size: tuple[float, float]) -> None:
    page = render({"html": "<p>x</p>", "options": options}).pages[0]
    assert float(page.mediabox.width) == pytest.approx(size[0], abs=0.5)
    assert float(page.mediabox.height) == pytest.approx(size[1], abs=0.5)


def test_options_override_the_documents_own_page_rule() -> None:
    html = "<style>@page { size: letter; margin: 0 }</style><p>x</p>"
    page = render({"html": html, "options": {"pageSize": "legal"}}).pages[0]
    assert (float(page.mediabox.width), float(page.mediabox.height)) == (612, 1008)


@pytest.mark.parametrize(
    "header",
    [
        "Quarterly report",
        'He said "stop" \\ then left',
        # Escaped, this is text; unescaped, it would close the string and the rule.
        '"; } @page { size: letter } p { content: "',
    ],
)
def test_header_text_is_on_every_page(header: str) -> None:
    reader = render({"html": pages_html(3), "options": {"headerText": header}})
    assert len(reader.pages) == 3
    for page in reader.pages:
        assert header in page.extract_text()
        assert float(page.mediabox.width) == pytest.approx(595.28, abs=0.5)


def test_a_margin_is_accepted() -> None:
    assert len(render({"html": pages_html(2), "options": {"margin": "20mm 1in"}}).pages) == 2


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, "document.pdf"),
        ("report", "report.pdf"),
        ("Report 2024.PDF", "Report_2024.pdf"),
        ("../../etc/passwd", "passwd.pdf"),
        ("C:\\Users\\me\\été.pdf", "ete.pdf"),
        ("...", "document.pdf"),
        (".hidden.pdf", "hidden.pdf"),
    ],
)
def test_filenames_are_safe_basenames(name: str | None, expected: str) -> None:
    assert pdf.safe_filename(name) == expected


def test_the_filename_option_reaches_the_saved_file() -> None:
    ctx = RecordingContext()
    data = pdf.run({"html": "<p>x</p>", "options": {"filename": "../invoice"}}, ctx)
    assert data["document"]["filename"] == "invoice.pdf"


def test_progress_goes_through_every_stage_and_page_in_order() -> None:
    ctx = RecordingContext()
    pdf.run({"html": pages_html(4)}, ctx)
    stages = [report["stage"] for report in ctx.reports]
    assert list(dict.fromkeys(stages)) == ["parse", "style", "layout", "write"]
    layout = [report["progress"] for report in ctx.reports if report["stage"] == "layout"]
    assert layout == [1, 2, 3, 4]
    progress = [report["progress"] for report in ctx.reports]
    assert progress == sorted(progress)
    assert ctx.reports[-1] == {"progress": 4, "total": 4, "stage": "write"}
    assert ctx.checkpoints >= len(ctx.reports)


# Params the input schema refuses never reach the runner: these are the wire's errors.
@pytest.mark.parametrize(
    ("params", "code", "path"),
    [
        ({"options": {}}, "MISSING_PARAM", "params.html"),
        ({"html": "<p>a</p>", "content": "<p>b</p>"}, "INVALID_PARAMS", "params"),
        ({"html": 42}, "INVALID_TYPE", "params.html"),
        ({"html": "x", "options": []}, "INVALID_TYPE", "params.options"),
        ({"html": "x", "options": {"pageSize": "a5"}}, "INVALID_PARAMS", "params.options.pageSize"),
        ({"html": "x", "options": {"landscape": "yes"}}, "INVALID_TYPE",
         "params.options.landscape"),
        ({"html": "x", "options": {"headerText": 7}}, "INVALID_TYPE", "params.options.headerText"),
        ({"html": "x", "options": {"headerText": "x" * 501}}, "INVALID_PARAMS",
         "params.options.headerText"),
        ({"html": "x", "options": {"filename": 7}}, "INVALID_TYPE", "params.options.filename"),
    ],
)  # fmt: skip
def test_unusable_params_are_refused(params: dict[str, Any], code: str, path: str) -> None:
    error = wire_refusal(params)
    assert error.code == code
    assert error.details is not None
    assert error.details["path"] == path


@pytest.mark.parametrize(
    "margin", ["20mm; } body { color: red", "20", "-5mm", "1e3mm", "calc(1mm)", "20mm\n", ""]
)
def test_bad_margins_are_refused(margin: str) -> None:
    error = wire_refusal({"html": "x", "options": {"margin": margin}})
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.options.margin", "rule": "pattern"}


def test_html_over_the_size_limit_is_refused() -> None:
    with limits(MAX_HTML_BYTES=100):
        # 60 characters, 120 bytes: the limit counts UTF-8 bytes.
        error = wire_refusal({"html": "é" * 60})
        assert render({"html": "é" * 50}).pages
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "params.html", "rule": "maxLength", "limit": 100}


def test_page_options_are_read_as_typed_values() -> None:
    request = pdf.parse({"content": "x", "options": {"pageSize": "LeTTer", "margin": "1in"}})
    assert (request.html, request.page_size, request.landscape) == ("x", "letter", False)
    assert request.filename == "document.pdf"
    assert (
        pdf.page_stylesheet(request) == "@page { size: letter !important; margin: 1in !important; }"
    )


def test_too_many_pages_stops_the_layout() -> None:
    ctx = RecordingContext()
    with limits(MAX_PDF_PAGES=2):
        error = refusal({"html": pages_html(5)}, ctx)
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "html", "limit": 2}
    assert [r["progress"] for r in ctx.reports if r["stage"] == "layout"] == [1, 2]
    assert "write" not in {report["stage"] for report in ctx.reports}
    assert ctx.files == {}


def test_an_abort_at_a_checkpoint_stops_the_layout() -> None:
    # Checkpoints before layout: the HTML, two stylesheets (the document's and the
    # options'), the cascade and the box tree; the 8th is page 3's.
    ctx = RecordingContext(abort_after_checkpoints=8)
    with pytest.raises(JobAborted):
        pdf.run({"html": pages_html(10), "options": {"pageSize": "a4"}}, ctx)
    assert [r["progress"] for r in ctx.reports if r["stage"] == "layout"] == [1, 2]
    assert ctx.files == {}


def test_an_abort_at_any_checkpoint_gets_out_of_weasyprint() -> None:
    html = pages_html(2)
    probe = RecordingContext()
    pdf.run({"html": html, "options": {"headerText": "h"}}, probe)
    for n in range(1, probe.checkpoints + 1):
        ctx = RecordingContext(abort_after_checkpoints=n)
        with pytest.raises(JobAborted):
            pdf.run({"html": html, "options": {"headerText": "h"}}, ctx)
        assert ctx.checkpoints == n


def test_concurrent_renders_only_hear_their_own_thread() -> None:
    contexts = {count: RecordingContext() for count in (2, 5)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(pdf.run, {"html": pages_html(n)}, ctx) for n, ctx in contexts.items()
        ]
        assert sorted(future.result()["pageCount"] for future in futures) == [2, 5]
    for count, ctx in contexts.items():
        layout = [r["progress"] for r in ctx.reports if r["stage"] == "layout"]
        assert layout == list(range(1, count + 1))


def test_the_progress_handler_is_removed_whatever_happens() -> None:
    logger = logging.getLogger("weasyprint.progress")
    handlers, level = list(logger.handlers), logger.level
    pdf.run({"html": "<p>x</p>"}, RecordingContext())
    with pytest.raises(JobAborted):
        pdf.run({"html": "<p>x</p>"}, RecordingContext(abort_after_checkpoints=1))
    refusal({"html": '<img src="file:///etc/passwd">'})
    assert (logger.handlers, logger.level) == (handlers, level)


def test_reports_reach_the_handler_even_when_the_logger_is_quiet() -> None:
    logger = logging.getLogger("weasyprint.progress")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        ctx = RecordingContext()
        pdf.run({"html": pages_html(2)}, ctx)
        assert [r["progress"] for r in ctx.reports if r["stage"] == "layout"] == [1, 2]
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(level)


@pytest.mark.parametrize(
    "html",
    [
        '<img src="file:///etc/passwd">',
        '<link rel="stylesheet" href="file:///etc/passwd">',
        "<style>@import url(file:///etc/passwd);</style>",
        "<style>p { background: url(file:///etc/passwd) }</style><p>x</p>",
        "<style>@font-face { font-family: x; src: url(file:///etc/passwd) }"
        " p { font-family: x }</style><p>x</p>",
        '<img src="http://127.0.0.1/x.png">',
        '<img src="http://169.254.169.254/latest/meta-data">',
        '<img src="ftp://example.com/x.png">',
    ],
)
def test_forbidden_resources_deny_the_whole_call(html: str) -> None:
    error = refusal({"html": html})
    assert error.code == "PERMISSION_DENIED"
    assert error.details is not None
    assert error.details["url"] in html


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1/x.png", "http://169.254.169.254/latest/meta-data"]
)
def test_internal_addresses_are_denied_even_when_allow_listed(url: str) -> None:
    with limits(URL_FETCH_ALLOWED_HOSTS=["127.0.0.1", "169.254.169.254"]):
        error = refusal({"html": f'<img src="{url}">'})
    assert error.code == "PERMISSION_DENIED"
    assert error.details == {"url": url}


def test_long_urls_are_shortened_in_errors() -> None:
    url = "file:///" + "a" * 5000
    error = refusal({"html": f'<img src="{url}">'})
    assert error.code == "PERMISSION_DENIED"
    assert error.details == {"url": url[:60] + "…"}
    assert len(error.message) < 200


def test_a_failed_fetch_fails_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with limits(URL_FETCH_ALLOWED_HOSTS=["cdn.example.com"]):
        error = refusal({"html": '<img src="https://cdn.example.com/a.png">'})
    assert error.code == "OPERATION_FAILED"
    assert error.details == {"url": "https://cdn.example.com/a.png"}


def test_data_urls_render(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither data: URLs nor a plain render may touch DNS or build a TLS context.
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no network setup expected")

    monkeypatch.setattr(socket, "getaddrinfo", forbidden)
    monkeypatch.setattr(ssl, "create_default_context", forbidden)
    html = f'<img src="{PNG_DATA_URL}" style="width: 10mm"><p>x</p>'
    assert len(render({"html": html}).pages) == 1


def font_face(url: str) -> str:
    return (
        f"<style>@font-face {{ font-family: f; src: url({url}) }} p {{ font-family: f }}</style>"
        "<p>x</p>"
    )


def resource_refusal(html: str, **overrides: Any) -> CapabilityError:
    """The runner's refusal of a resource: INVALID_PARAMS on html, its URL shortened."""
    with limits(**overrides):
        error = refusal({"html": html})
    assert error.code == "INVALID_PARAMS", error
    assert error.details is not None
    assert error.details["path"] == "html"
    assert len(error.details["url"]) <= 61
    assert len(error.message) < 300
    return error


@pytest.mark.parametrize("font", [woff_bomb(), woff2_bomb()], ids=["woff", "woff2"])
def test_a_font_declaring_too_much_is_invalid(font: bytes) -> None:
    error = resource_refusal(font_face(data_url("font/woff", font)))
    assert error.details is not None
    assert error.details["limit"] == abp_settings().MAX_FONT_BYTES
    assert "declaring" in error.message


@pytest.mark.parametrize("flavor", [None, "woff", "woff2"])
def test_real_fonts_render(flavor: str | None) -> None:
    reader = render({"html": font_face(data_url("font/woff", real_font(flavor)))})
    fonts: Any = reader.pages[0]["/Resources"]
    # The font loaded takes the @font-face's family name; a font that failed, DejaVu's.
    names = [str(font.get_object()["/BaseFont"]) for font in fonts["/Font"].values()]
    assert [name.split("+")[1] for name in names] == ["f"]


@pytest.mark.parametrize(
    "png", [png_header(12000, 12000), png_header(12000, 12000, bit_depth=16)], ids=["8", "16"]
)
@pytest.mark.parametrize(
    "template",
    ['<img src="{}">', "<style>p {{ background: url({}) }}</style><p>x</p>"],
    ids=["img", "css"],
)
def test_an_image_over_the_pixel_limit_is_invalid(png: bytes, template: str) -> None:
    error = resource_refusal(template.format(data_url("image/png", png)))
    assert error.details is not None
    assert error.details["limit"] == abp_settings().MAX_IMAGE_PIXELS
    assert "pixels" in error.message


def test_the_pixel_limit_is_the_setting() -> None:
    error = resource_refusal(
        f'<img src="{data_url("image/png", image("PNG"))}">', MAX_IMAGE_PIXELS=199
    )
    assert error.details is not None
    assert error.details["limit"] == 199
    assert "20x10" in error.message


@pytest.mark.parametrize("kind", ["BMP", "ICO"])
def test_raster_formats_outside_the_allow_list_are_invalid(kind: str) -> None:
    error = resource_refusal(f'<img src="{data_url("image/png", image(kind))}">')
    assert error.details is not None
    assert "limit" not in error.details
    assert kind in error.message


def test_a_refusal_inside_an_svg_still_fails_the_call() -> None:
    # WeasyPrint draws an SVG's own images inside `except BaseException`.
    inner = data_url("image/bmp", image("BMP"))
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
        f'<image href="{inner}" width="10" height="10"/></svg>'
    )
    resource_refusal(f'<img src="{data_url("image/svg+xml", svg.encode())}">')


def test_the_budget_counts_all_resources_once_each() -> None:
    one, other = data_url("image/png", image("PNG")), data_url("image/gif", image("GIF"))
    # WeasyPrint fetches an image once per render, however often it is used.
    assert len(render({"html": f'<img src="{one}">' * 30}).pages) == 1
    with limits(MAX_PDF_RESOURCE_BYTES=1000):
        assert len(render({"html": f'<img src="{one}">' * 30}).pages) == 1
    error = resource_refusal(f'<img src="{one}"><img src="{other}">', MAX_PDF_RESOURCE_BYTES=1000)
    assert error.details is not None
    assert error.details["limit"] == 1000


def test_a_data_url_is_bounded_like_a_fetched_body() -> None:
    html = f"<style>@import url({data_url('text/css', b' ' * 2001)});</style><p>x</p>"
    error = resource_refusal(html, URL_FETCH_MAX_BYTES=2000)
    assert error.details is not None
    assert error.details["limit"] == 2000


def test_too_many_elements_are_refused_before_styling() -> None:
    ctx = RecordingContext()
    with limits(MAX_PDF_ELEMENTS=100):
        # html, head and body are elements too.
        assert render({"html": "<p>x</p>" * 97}).pages
        error = refusal({"html": "<p>x</p>" * 98}, ctx)
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "html", "limit": 100}
    assert {report["stage"] for report in ctx.reports} == {"parse"}


def nested(depth: int, opening: str, closing: str, per_level: int) -> str:
    """Elements nested `depth` deep, html and body included, `per_level` per repeat."""
    levels, rest = divmod(depth - 2, per_level)
    return opening * levels + "<div>" * rest + "x" + "</div>" * rest + closing * levels


def nested_tables(depth: int) -> str:
    return nested(depth, "<table><tr><td>", "</td></tr></table>", 4)


@pytest.mark.parametrize(
    ("opening", "closing", "per_level"),
    [
        ("<table><tr><td>", "</td></tr></table>", 4),  # with the tbody the parser adds
        ("<div>", "</div>", 1),
        ("<ul><li>", "</li></ul>", 2),
        ('<div style="float: left">', "</div>", 1),
    ],
    ids=["tables", "divs", "lists", "floats"],
)
def test_nesting_up_to_the_depth_limit_renders(opening: str, closing: str, per_level: int) -> None:
    depth: int = abp_settings().MAX_PDF_DEPTH
    assert len(render({"html": nested(depth, opening, closing, per_level)}).pages) == 1
    ctx = RecordingContext()
    error = refusal({"html": nested(depth + 1, opening, closing, per_level)}, ctx)
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "html", "limit": depth}
    assert {report["stage"] for report in ctx.reports} == {"parse"}


def test_a_recursion_error_in_layout_is_invalid_params() -> None:
    # Past the depth limit, as a higher setting would let through.
    with limits(MAX_PDF_DEPTH=10_000):
        error = refusal({"html": nested_tables(2000 * 4)})
    assert error.code == "INVALID_PARAMS"
    assert error.details == {"path": "html"}
    assert "nested too deeply" in error.message


INPUT_VALIDATOR = Draft202012Validator(pdf_spec.INPUT_SCHEMA)
OUTPUT_VALIDATOR = Draft202012Validator(pdf_spec.OUTPUT_SCHEMA)


def test_schemas_are_draft_2020_12() -> None:
    Draft202012Validator.check_schema(pdf_spec.INPUT_SCHEMA)
    Draft202012Validator.check_schema(pdf_spec.OUTPUT_SCHEMA)


@pytest.mark.parametrize(
    "params",
    [
        {"html": "<p>x</p>"},
        {"content": "<p>x</p>"},
        {
            "html": "<p>x</p>",
            "options": {
                "pageSize": "LETTER",
                "landscape": True,
                "margin": "20mm",
                "headerText": "Report",
                "filename": "report.pdf",
            },
        },
        {"html": "x", "options": {"pageSize": "a4", "margin": "0 1.5in 10mm 12pt"}},
    ],
)
def test_the_input_schema_accepts(params: dict[str, Any]) -> None:
    assert list(INPUT_VALIDATOR.iter_errors(params)) == []


@pytest.mark.parametrize(
    ("params", "rule"),
    [
        ({}, "required"),
        ({"options": {"pageSize": "a4"}}, "required"),
        ({"html": "a", "content": "b"}, "not"),
        ({"html": 1}, "type"),
        ({"html": "x", "options": {"pageSize": "a5"}}, "pattern"),
        ({"html": "x", "options": {"margin": "20mm; color: red"}}, "pattern"),
        ({"html": "x", "options": {"margin": "20"}}, "pattern"),
        ({"html": "x", "options": {"landscape": "yes"}}, "type"),
        ({"html": "x", "options": {"headerText": "x" * 501}}, "maxLength"),
        ({"html": "x", "options": {"colour": "red"}}, "additionalProperties"),
        ({"html": "x", "extra": 1}, "additionalProperties"),
    ],
)
def test_the_input_schema_rejects(params: dict[str, Any], rule: str) -> None:
    assert rule in {error.validator for error in INPUT_VALIDATOR.iter_errors(params)}


def test_the_input_schema_and_the_runner_agree_on_margins() -> None:
    for margin in ("20mm", "0", "1in 2cm", "12.5pt 3px 4pc 0"):
        assert list(INPUT_VALIDATOR.iter_errors({"html": "x", "options": {"margin": margin}})) == []
        assert pdf.page_stylesheet(pdf.parse({"html": "x", "options": {"margin": margin}}))


@pytest.mark.parametrize(
    "document",
    [
        {
            "content": "JVBERi0=",
            "mimeType": "application/pdf",
            "encoding": "base64",
            "size": 5,
            "filename": "document.pdf",
        },
        {
            "downloadUrl": "https://app.example.com/abp/files/abc?sig=1",
            "mimeType": "application/pdf",
            "size": 12_000_000,
            "filename": "document.pdf",
            "expiresAt": "2030-01-01T00:00:00Z",
        },
    ],
)
def test_the_output_schema_accepts_both_wire_forms(document: dict[str, Any]) -> None:
    assert list(OUTPUT_VALIDATOR.iter_errors({"document": document, "pageCount": 3})) == []


@pytest.mark.parametrize(
    "data",
    [
        {"document": {"mimeType": "application/pdf", "size": 1, "filename": "a.pdf"}},
        {
            "document": {
                "content": "x",
                "mimeType": "image/png",
                "encoding": "base64",
                "size": 1,
                "filename": "a.pdf",
            },
            "pageCount": 1,
        },
        {"pageCount": 1},
    ],
)
def test_the_output_schema_rejects(data: dict[str, Any]) -> None:
    assert list(OUTPUT_VALIDATOR.iter_errors(data)) != []
