"""/mcp on Daphne: a key or access token first, then the SDK's Streamable HTTP manager.

Refusals follow MCP's authorization spec (docs/security.md#oauth-for-mcp-clients):
401 with a `WWW-Authenticate` challenge that points at the Protected Resource
Metadata, 403 `insufficient_scope` naming the scope, and no token in the URL.

Daphne sends no ASGI lifespan events, and the session manager's `run()` must be
entered once per process: the first request enters it, in a task that lives as
long as the process. Sessions are stateful and answer with SSE streams, the only
mode of this SDK that carries both progress and cancellation.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from django.conf import settings
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from capabilities.access import credentials, oauth_tokens
from capabilities.access.principal import Principal
from capabilities.conf import abp_settings
from capabilities.jobs import outages
from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.mcp_door import challenges, scope_checks, server, sessions
from capabilities.mcp_door.tool_calls import PRINCIPAL_SCOPE_KEY
from capabilities.protocol import ErrorCode
from capabilities.protocol.closes import REFUSAL_MESSAGES

PATH = "/mcp"
UNAVAILABLE_RETRY_AFTER_SECONDS = 1

logger = logging.getLogger(__name__)


def transport_security() -> TransportSecuritySettings:
    """DNS-rebinding and Origin checks from ALLOWED_HOSTS and ABP_ALLOWED_ORIGINS."""
    hosts: list[str] = []
    allowed = list(settings.ALLOWED_HOSTS)
    if not allowed and settings.DEBUG:
        # Django's own fallback for an empty ALLOWED_HOSTS under DEBUG.
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    for host in allowed:
        if host == "*":
            return TransportSecuritySettings(enable_dns_rebinding_protection=False)
        # The SDK matches Host exactly or `name:*`; Django's `.example.com` means the
        # domain and its subdomains, of which only the domain can be listed here.
        name = host.lstrip(".")
        hosts += [name, f"{name}:*"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=list(abp_settings().ALLOWED_ORIGINS),
    )


class MCPDoor:
    """The ASGI app served at /mcp."""

    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None
        self._running: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        principal, refused = await _authenticate(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        assert principal is not None
        if scope_checks.needs_checking(scope, principal):
            body, receive = await scope_checks.read_ahead(receive)
            missing = scope_checks.missing_scopes(principal, body)
            if missing:
                await _refusal(scope, "insufficient-scope", principal.scopes + missing)(
                    scope, receive, send
                )
                return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        # The session manager binds each session to the credential that opened it.
        scope["user"] = AuthenticatedUser(
            AccessToken(token="-", client_id=principal.rate_limit_id, scopes=[])
        )
        if scope["method"] == "DELETE":
            ending = dict(scope["headers"]).get(b"mcp-session-id")
            if ending:
                sessions.mark_ending(ending.decode("latin-1"))
        manager = await self._manager_running()
        await manager.handle_request(scope, receive, send)

    async def _manager_running(self) -> StreamableHTTPSessionManager:
        if self._running is None:
            self._manager = StreamableHTTPSessionManager(
                app=server.build(),
                json_response=False,
                stateless=False,
                security_settings=transport_security(),
                max_request_body_size=abp_settings().MAX_FRAME_BYTES,
                session_idle_timeout=abp_settings().MCP_SESSION_IDLE_SECONDS,
            )
            self._running = asyncio.get_running_loop().create_future()
            self._task = asyncio.get_running_loop().create_task(self._serve(self._running))
        await asyncio.shield(self._running)
        assert self._manager is not None
        return self._manager

    async def _serve(self, running: asyncio.Future[None]) -> None:
        assert self._manager is not None
        try:
            async with self._manager.run():
                running.set_result(None)
                await asyncio.Event().wait()  # as long as the process lives
        except BaseException as exc:
            if not running.done():
                running.set_exception(exc)
            raise


async def _authenticate(scope: Scope) -> tuple[Principal | None, Response | None]:
    """The caller, or the response refusing it (401 or 403 with why, as JSON-RPC)."""
    if credentials.query_credential(scope) is not None:
        return None, _refusal(scope, "token-in-query")
    try:
        principal: Principal = await credentials.authenticate_async(scope, query=False)
    except credentials.Refused as refused:
        return None, _refusal(scope, refused.reason)
    except outages.DATABASE_AWAY:
        # The key could not be looked up (PostgreSQL restarting): try again, not a 500.
        logger.warning("MCP request refused: the agent key could not be checked", exc_info=True)
        return None, _unavailable()
    if principal.kind == "page":
        return None, _refusal(scope, "invalid-credentials")
    if principal.kind == "anonymous" and oauth_tokens.enabled():
        # With OAuth on, an MCP client must meet the challenge to find it (even in
        # development, where WebSockets may come in without a key).
        return None, _refusal(scope, "missing-credentials")
    return principal, None


def _unavailable() -> Response:
    return _error_response(
        ErrorCode.INTERNAL_ERROR,
        "The agent key could not be checked now; try again.",
        {"code": ErrorCode.INTERNAL_ERROR.value, "retryable": True},
        status=503,
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
    )


def _refusal(scope: Scope, reason: str, needed: tuple[str, ...] = ()) -> Response:
    # The code ACP gives "authentication required", from the one table.
    status, challenge = challenges.challenge(scope, reason, needed)
    return _error_response(
        ErrorCode.PERMISSION_DENIED,
        REFUSAL_MESSAGES[reason],
        {"reason": reason},
        status=status,
        headers={"WWW-Authenticate": challenge},
    )


def _error_response(
    error: ErrorCode, message: str, data: dict[str, Any], *, status: int, headers: dict[str, str]
) -> Response:
    """A JSON-RPC error answering no request (id null), as an HTTP response of its own."""
    code, _ = jsonrpc_error(error)
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message, "data": data}}
    return Response(
        json.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def routed(mcp: MCPDoor, django: Any) -> Any:
    """HTTP to /mcp goes to the MCP door, the rest to Django."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH:
            await mcp(scope, receive, send)
        else:
            await django(scope, receive, send)

    return app
