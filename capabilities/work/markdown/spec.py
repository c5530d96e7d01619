"""The convert.markdownToHtml capability as agents see it: description, JSON Schemas, limits.

Kept apart from the runner (`capabilities.work.markdown.runner`), so the web process, which
reads the schemas, never loads Markdown or nh3. Declared in capabilities/abp_capabilities.py.
"""

from __future__ import annotations

from typing import Any

from capabilities.work.registry import SizeLimit

DESCRIPTION = (
    "Convert Markdown to an HTML fragment: Python-Markdown with its 'extra' set (tables, "
    "fenced code, footnotes, definition lists, abbreviations, attribute lists) and "
    "sane lists. By default the HTML is sanitized: scripts, iframes, styles, event "
    "handlers and javascript: links are removed, raw HTML is kept only where it is "
    "harmless. With options.sanitize false the raw output is returned, including any "
    "raw HTML in the Markdown: making it safe to display is then the caller's job. "
    "Markdown over the server's size limit (1 MiB by default, UTF-8) is refused."
)

INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "markdown": {"type": "string", "description": "The Markdown text."},
        "options": {
            "type": "object",
            "properties": {
                "sanitize": {
                    "type": "boolean",
                    "default": True,
                    "description": (
                        "Remove unsafe HTML from the output. False returns the raw "
                        "output, unsafe raw HTML included."
                    ),
                },
            },
            "additionalProperties": False,
        },
    },
    "required": ["markdown"],
    "additionalProperties": False,
}

OUTPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "html": {"type": "string", "description": "The HTML fragment (no <html> or <body>)."},
    },
    "required": ["html"],
    "additionalProperties": False,
}


SIZE_LIMITS = (SizeLimit(path=("markdown",), setting="MAX_MARKDOWN_BYTES"),)
