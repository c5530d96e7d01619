"""The `convert.markdownToHtml` runner: Markdown in, an HTML fragment out.

Python-Markdown renders (the "extra" extensions and sane lists; none of them reads
files or fetches anything); nh3 (ammonia) then sanitizes, unless the caller asks for
the raw output. Markdown passes raw HTML through, so with `sanitize: false` the output
is as unsafe as the input: making it safe to display is the caller's responsibility.

Rendering is pure Python with no hook inside: a cancel arriving during it is raised
into the thread by the worker. The parameters are only read here: the input schema
checked them, their size too, before the job was queued. Only workers import this
module (the schemas live in `spec`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import markdown
import nh3

from capabilities.protocol.errors import ErrorCode
from capabilities.protocol.fields import Fields
from capabilities.work.context import CapabilityError, JobContext

EXTENSIONS = ("extra", "sane_lists")

# What Markdown extra emits beyond nh3's default allow-list: link and abbreviation
# titles, table cell alignment (as `style`), code language and footnote classes, and
# footnote ids. Classes and ids are narrowed further by `_filter_attribute`.
_EXTRA_ATTRIBUTES: dict[str, set[str]] = {
    "a": {"title", "class"},
    "img": {"title"},
    "abbr": {"title"},
    "th": {"style"},
    "td": {"style"},
    "code": {"class"},
    "div": {"class"},
    "sup": {"id"},
    "li": {"id"},
}
ATTRIBUTES: dict[str, set[str]] = {
    tag: nh3.ALLOWED_ATTRIBUTES.get(tag, set()) | _EXTRA_ATTRIBUTES.get(tag, set())
    for tag in nh3.ALLOWED_ATTRIBUTES.keys() | _EXTRA_ATTRIBUTES.keys()
}
# Removed with their content: left as text, a script or a frame's markup would show.
CLEAN_CONTENT_TAGS = frozenset({"script", "style", "iframe", "noscript", "object", "template"})
_CLASSES = {"a": {"footnote-ref", "footnote-backref"}, "div": {"footnote"}}
_CODE_CLASS = re.compile(r"language-[\w#.+-]+")
# The footnotes extension's ids: fn:<label>, fnref:<label>, fnref2:<label>, ... Any
# other id (`{#id}` of attr_list) could clobber an id of the page showing the HTML.
_FOOTNOTE_ID = re.compile(r"fn(ref\d*)?:.+", re.DOTALL)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_local = threading.local()


def run(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Convert `params.markdown` to HTML, sanitized unless options.sanitize is false."""
    fields = Fields(params, "params")
    text = fields.string("markdown")
    sanitize = fields.object("options").boolean("sanitize", True)
    ctx.checkpoint()
    html = to_html(text, sanitize=sanitize)
    ctx.checkpoint()
    ctx.report(progress=1, total=1, stage="convert")
    return {"html": html}


def to_html(text: str, *, sanitize: bool = True) -> str:
    """The HTML fragment for `text`; sanitized with `sanitize_html` if asked."""
    # A lone surrogate (valid in JSON, not in UTF-8) would make nh3 fail.
    text = _SURROGATE.sub("\ufffd", text)
    try:
        html: str = _converter().reset().convert(text)
    except RecursionError:
        _local.converter = None
        # Python-Markdown recurses once per nesting level (lists, quotes, HTML blocks).
        raise _invalid("The Markdown is nested too deeply to convert.") from None
    except BaseException:
        _local.converter = None
        raise
    return sanitize_html(html) if sanitize else html


def _converter() -> markdown.Markdown:
    """This thread's Markdown instance, made once: building one loads every extension.

    Reset before each use. A conversion that ended halfway (a RecursionError, a
    cancel raised into it) drops the instance instead: `reset` does not undo what
    it left (raw HTML came out escaped for every later document). One per thread:
    an instance holds the state of the document it converts.
    """
    converter: markdown.Markdown | None = getattr(_local, "converter", None)
    if converter is None:
        converter = _local.converter = markdown.Markdown(
            extensions=list(EXTENSIONS), output_format="html"
        )
    return converter


def sanitize_html(html: str) -> str:
    """`html` with only nh3's default tags and what Markdown extra needs left in it."""
    # Removed blocks leave their blank lines behind.
    return _CLEANER.clean(html).strip()


def _filter_attribute(tag: str, name: str, value: str) -> str | None:
    """Narrow the allowed `class` and `id` values; other attributes pass unchanged."""
    if name == "class":
        kept = [
            token
            for token in value.split()
            if token in _CLASSES.get(tag, ()) or (tag == "code" and _CODE_CLASS.fullmatch(token))
        ]
        return " ".join(kept) or None
    if name == "id":
        return value if _FOOTNOTE_ID.fullmatch(value) else None
    return value


_CLEANER = nh3.Cleaner(
    tags=nh3.ALLOWED_TAGS,
    clean_content_tags=CLEAN_CONTENT_TAGS,
    attributes=ATTRIBUTES,
    attribute_filter=_filter_attribute,
    # Table alignment is the only style Markdown writes.
    filter_style_properties={"text-align"},
)


def _invalid(message: str, **details: Any) -> CapabilityError:
    return CapabilityError(
        ErrorCode.INVALID_PARAMS, message, details={"path": "params.markdown", **details}
    )


def warm_up() -> None:
    """Convert a tiny document once, so Markdown's extensions load before the fork."""
    to_html("# warm-up\n\n| a |\n|---|\n| b |")
