"""The `export.pdf` runner: HTML in, a PDF file out, rendered by WeasyPrint.

Progress, the page limit and cancellation ride on WeasyPrint's progress log, the
only hook it has inside layout: a handler raising there stops the render. The size
of the parsed document (elements, nesting) is checked before styling, which costs
far more per element than parsing; what its resources become, in the fetcher. The
parameters are only read here: the input schema checked them before the job was
queued. Only workers import this module (the schemas live in `spec`).
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from xml.etree.ElementTree import Element

import weasyprint

from capabilities.conf import abp_settings
from capabilities.protocol.errors import ErrorCode
from capabilities.protocol.fields import Fields
from capabilities.work.context import CapabilityError, JobContext
from capabilities.work.pdf.fetcher import (
    FetchError,
    ResourceRefused,
    URLNotAllowed,
    fetcher_from_settings,
    shorten_url,
)
from capabilities.work.pdf.spec import DEFAULT_FILENAME, PageSize


@dataclass(frozen=True, kw_only=True)
class Request:
    """The call's parameters, as typed values."""

    html: str
    page_size: PageSize | None
    landscape: bool
    margin: str | None
    header_text: str | None
    filename: str


def parse(params: dict[str, Any]) -> Request:
    """The parameters, valid by the input schema, as typed values."""
    fields = Fields(params, "params")
    options = fields.object("options")
    html = fields.optional_string("html")
    size = options.optional_string("pageSize")
    return Request(
        # The schema lets through exactly one of the two.
        html=fields.string("content") if html is None else html,
        page_size=None if size is None else PageSize(size.lower()),
        landscape=options.boolean("landscape", False),
        margin=options.optional_string("margin"),
        header_text=options.optional_string("headerText"),
        filename=safe_filename(options.optional_string("filename")),
    )


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Render the HTML to PDF, save it through `ctx`, and return the result data."""
    request = parse(params)
    pdf, page_count = _render(request.html, page_stylesheet(request), ctx)
    ctx.report(progress=page_count, total=page_count, stage="write")
    document = ctx.save_file(pdf, mime_type="application/pdf", filename=request.filename)
    return {"document": document, "pageCount": page_count}


def page_stylesheet(request: Request) -> str:
    """The `@page` rule for the options; `!important` so it beats the document's own."""
    rules: list[str] = []
    if request.page_size is not None or request.landscape:
        size = request.page_size or PageSize.A4
        rules.append(f"size: {size}{' landscape' if request.landscape else ''} !important;")
    if request.margin is not None:
        # Written as is: the schema's pattern lets through only CSS lengths.
        rules.append(f"margin: {request.margin} !important;")
    if request.header_text is not None:
        rules.append(f"@top-center {{ content: {_css_string(request.header_text)} !important; }}")
    return f"@page {{ {' '.join(rules)} }}" if rules else ""


def safe_filename(name: str | None) -> str:
    """A plain ASCII basename ending in .pdf, or the default."""
    if name is None:
        return DEFAULT_FILENAME
    base = re.split(r"[/\\]", name)[-1]
    base = unicodedata.normalize("NFKD", base).encode("ascii", "ignore").decode()
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", base)
    stem = (base[:-4] if base.lower().endswith(".pdf") else base).strip("._")[:100]
    return f"{stem}.pdf" if stem else DEFAULT_FILENAME


def _css_string(text: str) -> str:
    """`text` as a CSS string literal: quotes, backslashes and controls hex-escaped."""
    escaped = "".join(
        f"\\{ord(char):x} " if char in '"\\' or ord(char) < 0x20 or ord(char) == 0x7F else char
        for char in text
    )
    return f'"{escaped}"'


def _invalid(path: str, message: str, **details: Any) -> CapabilityError:
    return CapabilityError(ErrorCode.INVALID_PARAMS, message, details={"path": path, **details})


class _TooManyPages(BaseException):
    """Raised inside layout; a BaseException so WeasyPrint's `except Exception` let it by."""


# The progress log's message prefixes, by WeasyPrint step (see weasyprint/logger.py).
_STEP = re.compile(r"Step (\d) - ")
_STAGES = {"1": "parse", "2": "parse", "3": "style", "4": "style", "5": "layout"}
_PAGE_MESSAGE = "Step 5 - Creating layout - Page %d"


class _Progress(logging.Handler):
    """Turns the render thread's progress records into checkpoints and reports."""

    def __init__(self, ctx: JobContext, max_pages: int) -> None:
        super().__init__(logging.INFO)
        self._ctx, self._max_pages = ctx, max_pages
        self._thread = threading.get_ident()
        self._stage, self._pages = "", 0

    def emit(self, record: logging.LogRecord) -> None:
        match = _STEP.match(str(record.msg))
        if record.thread != self._thread or match is None:
            return
        stage = _STAGES.get(match[1], "write")
        self._ctx.checkpoint()
        args = record.args if isinstance(record.args, tuple) else ()
        page = args[0] if record.msg == _PAGE_MESSAGE and args else None
        # Pages laid out again (repagination) are checkpoints, not progress.
        if isinstance(page, int) and page > self._pages:
            if page > self._max_pages:
                raise _TooManyPages
            self._stage, self._pages = stage, page
            self._ctx.report(progress=page, total=None, stage=stage)
        elif stage != self._stage:
            self._stage = stage
            self._ctx.report(progress=self._pages, total=None, stage=stage)


class _ProgressLog:
    """WeasyPrint's progress logger, held at INFO while any render listens to it."""

    def __init__(self) -> None:
        self._logger = logging.getLogger("weasyprint.progress")
        self._lock = threading.Lock()
        self._listeners = 0
        self._saved_level = logging.NOTSET

    @contextmanager
    def listening(self, handler: logging.Handler) -> Iterator[None]:
        with self._lock:
            if self._listeners == 0:
                self._saved_level = self._logger.level
                if not self._logger.isEnabledFor(logging.INFO):
                    self._logger.setLevel(logging.INFO)
            self._listeners += 1
            self._logger.addHandler(handler)
        try:
            yield
        finally:
            with self._lock:
                self._logger.removeHandler(handler)
                self._listeners -= 1
                if self._listeners == 0:
                    self._logger.setLevel(self._saved_level)


_PROGRESS_LOG = _ProgressLog()


def _render(html: str, stylesheet: str, ctx: JobContext) -> tuple[bytes, int]:
    max_pages: int = abp_settings().MAX_PDF_PAGES
    fetcher = fetcher_from_settings()
    try:
        with _PROGRESS_LOG.listening(_Progress(ctx, max_pages)):
            source = weasyprint.HTML(string=html, base_url=None, url_fetcher=fetcher)
            _check_tree(source.etree_element)
            extra = [weasyprint.CSS(string=stylesheet, url_fetcher=fetcher)] if stylesheet else []
            document = source.render(stylesheets=extra)
            pdf = document.write_pdf()
            # WeasyPrint swallows even a fatal fetch error while it draws an SVG's images.
            if fetcher.failure is not None:
                raise fetcher.failure
            return pdf, len(document.pages)
    except _TooManyPages:
        message = f"The document has more than {max_pages} pages."
        raise _invalid("html", message, limit=max_pages) from None
    except RecursionError:
        # Within MAX_PDF_DEPTH, some structures still recurse past Python's limit (nested
        # inline-blocks or inline tables); a higher MAX_PDF_DEPTH lets more through.
        message = "The document is nested too deeply to lay out."
        raise _invalid("html", message) from None
    except FetchError as error:
        raise _fetch_error(error) from error


def _check_tree(root: Element) -> None:
    """Refuse a parsed document with too many elements or too deep a nesting."""
    max_elements: int = abp_settings().MAX_PDF_ELEMENTS
    max_depth: int = abp_settings().MAX_PDF_DEPTH
    elements = 0
    # Depth first, without recursion: the nesting is what is being measured.
    pending = [(root, 1)]
    while pending:
        element, depth = pending.pop()
        elements += 1
        if elements > max_elements:
            message = f"The document has more than {max_elements} elements."
            raise _invalid("html", message, limit=max_elements)
        if depth > max_depth:
            message = f"The document nests elements more than {max_depth} deep."
            raise _invalid("html", message, limit=max_depth)
        pending.extend((child, depth + 1) for child in element)


def _fetch_error(error: FetchError) -> CapabilityError:
    """The call's error for a resource that stopped the render; its URL shortened."""
    url = shorten_url(error.url)
    if isinstance(error, ResourceRefused):
        details: dict[str, Any] = {"path": "html", "url": url}
        if error.limit is not None:
            details["limit"] = error.limit
        message = f"The resource {url} is refused: {error.reason}."
        return CapabilityError(ErrorCode.INVALID_PARAMS, message, details=details)
    if isinstance(error, URLNotAllowed):
        message = f"Fetching {url} is not allowed: {error.reason}."
        return CapabilityError(ErrorCode.PERMISSION_DENIED, message, details={"url": url})
    message = f"Fetching {url} failed: {error.reason}."
    return CapabilityError(ErrorCode.OPERATION_FAILED, message, details={"url": url})


def warm_up() -> None:
    """Render a tiny document once, so the first job of a worker is not the slow one.

    Called in the worker's main process before it forks its pool: fontconfig's and
    WeasyPrint's start-up work is then shared by every child.
    """
    weasyprint.HTML(string="<p>warm-up</p>").write_pdf()
