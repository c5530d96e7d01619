"""Capabilities as MCP tools, and ABP responses as tool results (no I/O)."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from capabilities.protocol import WireError
from capabilities.work import registry

# Binary results up to this size come back inline (base64); larger ones as a signed
# download URL. MCP's Python client refuses any SSE event over 1 MiB.
INLINE_MAX_BYTES = 512 * 1024
# The text block repeats a result this small; a larger one is summarized in it.
TEXT_MAX_BYTES = 16 * 1024
AVAILABLE_META = "abp/available"


def tool_list(available: dict[str, bool]) -> list[types.Tool]:
    """One tool per capability, with the schemas `/abp.json` gives."""
    return [_tool(spec.describe(), available.get(spec.name, True)) for spec in registry.all_specs()]


def _tool(entry: dict[str, Any], available: bool) -> types.Tool:
    description = entry["description"]
    if not available:
        description += " (Unavailable now: no worker is running it.)"
    return types.Tool(
        name=entry["name"],
        description=description,
        input_schema=entry["inputSchema"],
        output_schema=entry["outputSchema"],
        # Any tool may run as a task (2025-11-25; the 2026 wire drops the field).
        execution=types.ToolExecution(task_support="optional"),
        _meta={AVAILABLE_META: available, "abp/timeout": entry["timeout"]},
    )


def tool_result(response: dict[str, Any]) -> types.CallToolResult:
    """The tool result of an ABPResponse: its data, or its error with isError."""
    if response.get("success"):
        data: dict[str, Any] = response.get("data") or {}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text_of(data))],
            structured_content=data,
        )
    return error_result(response["error"])


def refusal_result(error: WireError) -> types.CallToolResult:
    """The tool result of a call the call service refused."""
    return error_result(error.to_json())


def error_result(error: dict[str, Any]) -> types.CallToolResult:
    """isError, with the ABP error as structured content and as text."""
    text = f"{error['code']}: {error['message']}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"error": error},
        is_error=True,
    )


def _text_of(data: dict[str, Any]) -> str:
    text = json.dumps(data, ensure_ascii=False)
    if len(text.encode()) <= TEXT_MAX_BYTES:
        return text
    parts = ", ".join(sorted(data))
    return f"The result ({len(text)} characters of JSON: {parts}) is in structuredContent."
