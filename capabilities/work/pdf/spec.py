"""The export.pdf capability as agents see it: description, JSON Schemas, limits.

Kept apart from the runner (`capabilities.work.pdf.runner`), so the web process, which reads
the schemas, never loads WeasyPrint. Declared in capabilities/abp_capabilities.py.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from capabilities.work.registry import SizeLimit
from capabilities.work.schemas import binary_result

DESCRIPTION = (
    "Render an HTML document (with its CSS, print media) to a PDF. Relative URLs do not "
    "resolve; images, stylesheets and fonts load from data: URLs, or over http(s) from "
    "the server's allow-listed hosts only. Raster images must be JPEG, PNG, WebP, GIF or "
    "TIFF. The server bounds a document's pages, elements and nesting depth, each font's "
    "and image's decoded size, and all its resources together: past one, the call fails "
    "with INVALID_PARAMS, a message naming it and details.limit. Reports progress page "
    "by page; cancellable."
)

_LENGTH = r"(0|[0-9]{1,4}(\.[0-9]{1,3})?(mm|cm|in|pt|pc|px))"
# One to four lengths, as in the CSS `margin` shorthand. The value is written into CSS.
MARGIN_PATTERN = rf"^{_LENGTH}( {_LENGTH}){{0,3}}$"
DEFAULT_FILENAME = "document.pdf"


class PageSize(StrEnum):
    """A page size, as CSS names it."""

    A4 = "a4"
    LETTER = "letter"
    LEGAL = "legal"


# A page size in any case: each letter a class of both cases, as in `[aA]4`.
PAGE_SIZE_PATTERN = "^({})$".format(
    "|".join(
        "".join(f"[{char}{char.upper()}]" if char.isalpha() else char for char in size)
        for size in PageSize
    )
)

INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "html": {"type": "string", "description": "The HTML document."},
        "content": {"type": "string", "description": "An alias of html."},
        "options": {
            "type": "object",
            "properties": {
                "pageSize": {
                    "type": "string",
                    "pattern": PAGE_SIZE_PATTERN,
                    "description": "a4, letter or legal, in any case. Default a4.",
                },
                "landscape": {"type": "boolean", "default": False},
                "margin": {
                    "type": "string",
                    "pattern": MARGIN_PATTERN,
                    "description": "Page margin: one to four CSS lengths, e.g. '20mm'.",
                },
                "headerText": {
                    "type": "string",
                    "maxLength": 500,
                    "description": "Text printed at the top of every page.",
                },
                "filename": {
                    "type": "string",
                    "maxLength": 255,
                    "description": "The file name; made a safe *.pdf basename.",
                    "default": DEFAULT_FILENAME,
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
    # Exactly one of html and content; written as if/then/else so that neither reads
    # as a missing `html` rather than as a failed alternative.
    "if": {"not": {"required": ["content"]}},
    "then": {"required": ["html"]},
    "else": {"not": {"required": ["html"]}},
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "document": binary_result({"const": "application/pdf"}, "a PDF"),
        "pageCount": {"type": "integer", "minimum": 1},
    },
    "required": ["document", "pageCount"],
}


# The HTML's size, bounded by a setting (either name of it).
SIZE_LIMITS = (
    SizeLimit(path=("html",), setting="MAX_HTML_BYTES"),
    SizeLimit(path=("content",), setting="MAX_HTML_BYTES"),
)
