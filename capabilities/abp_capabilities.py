"""The built-in capabilities, declared as any project declares its own.

Imported at app start, before other apps' `abp_capabilities` modules, so the built-ins
come first. Their schemas are in `work/<name>/spec.py`; their libraries (WeasyPrint,
Pillow, Markdown) are imported inside the functions and by the warm-ups, which the
worker runs before it forks: the web process never loads them. Each comes with an
extra (`abp-jobs[pdf]`, `[images]`, `[markdown]`) and is registered only where that
extra is installed (`work/extras.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capabilities.work import extras
from capabilities.work.context import JobContext
from capabilities.work.declare import capability
from capabilities.work.images import spec as images_spec
from capabilities.work.markdown import spec as markdown_spec
from capabilities.work.pdf import spec as pdf_spec

BuiltInFunction = Callable[[dict[str, Any], JobContext], dict[str, Any]]


def built_in(name: str, **declaration: Any) -> Callable[[BuiltInFunction], BuiltInFunction]:
    """`@capability(name, ...)` where the built-in's extra is installed; else nothing."""
    if extras.installed(name):
        return capability(name, **declaration)
    return lambda function: function


@built_in(
    "export.pdf",
    description=pdf_spec.DESCRIPTION,
    input_schema=pdf_spec.INPUT_SCHEMA,
    output_schema=pdf_spec.OUTPUT_SCHEMA,
    size_limits=pdf_spec.SIZE_LIMITS,
    timeout_ms=2 * 60 * 1000,
    max_timeout_ms=15 * 60 * 1000,
    warm_up="capabilities.work.pdf.runner.warm_up",
)
def export_pdf(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """HTML to PDF with WeasyPrint."""
    from capabilities.work.pdf import runner

    return runner.run(params, ctx)


@built_in(
    "process.image",
    description=images_spec.DESCRIPTION,
    input_schema=images_spec.INPUT_SCHEMA,
    output_schema=images_spec.OUTPUT_SCHEMA,
    size_limits=images_spec.SIZE_LIMITS,
    setting_maxima=images_spec.SETTING_MAXIMA,
    timeout_ms=60 * 1000,
    max_timeout_ms=5 * 60 * 1000,
    warm_up="capabilities.work.images.runner.warm_up",
)
def process_image(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """An image's operations with Pillow."""
    from capabilities.work.images import runner

    return runner.run(params, ctx)


@built_in(
    "convert.markdownToHtml",
    description=markdown_spec.DESCRIPTION,
    input_schema=markdown_spec.INPUT_SCHEMA,
    output_schema=markdown_spec.OUTPUT_SCHEMA,
    size_limits=markdown_spec.SIZE_LIMITS,
    timeout_ms=30 * 1000,
    max_timeout_ms=2 * 60 * 1000,
    cost="small",
    warm_up="capabilities.work.markdown.runner.warm_up",
)
def markdown_to_html(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Markdown to sanitised HTML."""
    from capabilities.work.markdown import runner

    return runner.run(params, ctx)
