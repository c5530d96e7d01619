"""Who may use a connection: authenticate at connect, refuse with a reason, revoke.

A mixin of ABPConsumer (capabilities/consumers.py); the checks themselves are in
capabilities/ws_auth.py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async

from capabilities import agent_keys, replies, session_store, ws_auth
from capabilities.protocol import ErrorCode, WireError

if TYPE_CHECKING:
    from capabilities.layer import RetryingLayer
    from capabilities.session import Action, Session


class AccessMixin:
    """Authentication, refusals and key revocation for ABPConsumer."""

    if TYPE_CHECKING:
        scope: dict[str, Any]
        layer: RetryingLayer
        channel_name: str
        principal: ws_auth.Principal | None
        key_group: str | None
        session: Session
        serial: asyncio.Lock
        socket_gone: bool

        async def accept(self, subprotocol: str | None = None) -> None: ...
        async def send(
            self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
        ) -> None: ...
        async def close(self, code: int | None = None, reason: str | None = None) -> None: ...
        async def perform(self, actions: list[Action], *, connected: bool = True) -> None: ...

    async def authenticate(self) -> ws_auth.Principal | None:
        """Who this is; None if refused (the socket then is told why and closed)."""
        prefix = ws_auth.key_prefix_presented(self.scope)
        if prefix is not None:
            # Joined before the key is checked: a revoke racing this connect is heard.
            self.key_group = agent_keys.key_group(prefix)
            await self.layer.group_add(self.key_group, self.channel_name)
        try:
            self.principal = await database_sync_to_async(ws_auth.authenticate)(self.scope)
        except ws_auth.Refused as refused:
            await self.accept(subprotocol=ws_auth.selected_subprotocol(self.scope))
            await self.refuse(refused.reason)
            return None
        return self.principal

    async def refuse(self, reason: str) -> None:
        """Say why in a `notifications/error`, then close with the reason's code.

        Daphne drops close reasons, so the frame carries the stable reason.
        """
        code = ws_auth.CLOSE_CODES[reason]
        error = WireError(
            code=ErrorCode.PERMISSION_DENIED,
            message=ws_auth.REFUSAL_MESSAGES[reason],
            retryable=reason == "expired-credentials",
            details={"reason": reason, "closeCode": code},
        )
        await self.send(text_data=replies.notification("notifications/error", error.to_json()))
        await self.close(code=code)

    # -- a note from agent_keys.revoke (channel layer) ---------------------------------

    async def agent_key_revoked(self, event: dict[str, Any]) -> None:
        """The key this connection opened with was revoked: end its calls, close."""
        async with self.serial:
            if self.principal is None or self.socket_gone:
                return
            await self.perform(self.session.revoked())
            await self.refuse("key-revoked")
            if self.session.session_id is not None:
                await database_sync_to_async(session_store.close_session)(
                    self.session.session_id, "agent key revoked"
                )
