"""What every ABP WebSocket consumer does below the session: Channels' dispatch without
a database hop per message, and a socket that may be gone when a frame is sent."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.db import aclose_old_connections
from channels.generic.websocket import AsyncWebsocketConsumer

# Django closes stale database connections before each request; a connection checks at
# most this often (the database thread is the process's, shared by every connection).
CONNECTION_CHECK_SECONDS = 1.0


class WebsocketBase(AsyncWebsocketConsumer):  # type: ignore[misc]
    """Frames sent while the socket may be gone; stale connections closed sparingly."""

    closed = False
    """The socket, as far as this process knows."""
    connections_checked_at = 0.0

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its hop to close stale database connections
        before every message (a cancel would queue behind the call's insert): frames
        other than cancels call `close_stale_connections` instead."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def close_stale_connections(self) -> None:
        """Django's per-request clean-up of database connections, at most once a second."""
        now = time.monotonic()
        if now - self.connections_checked_at >= CONNECTION_CHECK_SECONDS:
            self.connections_checked_at = now
            await aclose_old_connections()

    async def send_frame(self, text: str) -> bool:
        """Send a frame; False if the socket is gone.

        A note can arrive after the socket closed and before Daphne delivers the
        disconnect; the frame is dropped (the outcome stays in the DB).
        """
        if self.closed:
            return False
        try:
            await self.send(text_data=text)
        except (Disconnected, OSError):  # autobahn's, or the server's "closed" (asgi.py)
            self.closed = True
            return False
        return True

    async def close_socket(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Disconnected):
                await self.close(code=code)
