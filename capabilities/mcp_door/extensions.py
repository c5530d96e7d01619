"""SEP-2133 extensions on the low-level server, as `MCPServer(extensions=[...])` applies them.

The SDK's `Extension` declares what it adds (request methods, a `tools/call`
interceptor, its advertised settings); `MCPServer` consumes it, the low-level
`Server` this door runs does not. `apply` does the same, with one difference: a
method the server already serves on other wire versions (the 2025-11-25
`tasks/get`, which SEP-2663 gives a new shape on 2026-07-28) is routed by the
request's version instead of being refused, as SEP-2663 suggests for servers that
serve both flows.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.extension import (
    Extension,
    MethodBinding,
    compose_tool_call_handler,
    validate_extension_identifier,
)
from mcp.server.lowlevel.server import HandlerEntry, Server
from mcp.shared.exceptions import MCPError


def apply(server: Server[Any], extension: Extension) -> None:
    """Serve the extension's methods, wrap `tools/call` in its interceptor, advertise it."""
    validate_extension_identifier(extension.identifier, owner=type(extension).__name__)
    for binding in extension.methods():
        before = server.get_request_handler(binding.method)
        server.add_request_handler(binding.method, types.RequestParams, _routed(binding, before))
    calls = server.get_request_handler("tools/call")
    if (
        calls is not None
        and type(extension).intercept_tool_call is not Extension.intercept_tool_call
    ):
        wrapped = compose_tool_call_handler([extension], calls.handler)
        server.add_request_handler("tools/call", types.CallToolRequestParams, wrapped)
    # Advertised in `server/discover`; the 2025 `initialize` result has no such field.
    server.extensions[extension.identifier] = extension.settings()


def _routed(binding: MethodBinding, before: HandlerEntry[Any] | None) -> Any:
    """The binding's handler on its versions; elsewhere what was there, or -32601."""

    async def handler(ctx: ServerRequestContext[Any, Any], _: types.RequestParams) -> HandlerResult:
        versions = binding.protocol_versions
        if versions is None or ctx.protocol_version in versions:
            params_type, serve = binding.params_type, binding.handler
        elif before is not None:
            params_type, serve = before.params_type, before.handler
        else:
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", data=ctx.method)
        # A ValidationError here is answered -32602, as the runner's own check is.
        params = params_type.model_validate(ctx.params or {}, by_name=False)
        result: HandlerResult = await serve(ctx, params)
        return result

    return handler
