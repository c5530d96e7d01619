"""A connection's channel-layer groups: its session's notes, workers coming and going,
and its agent key's revocation."""

from __future__ import annotations

from typing import Any

from capabilities.access import agent_keys
from capabilities.calls import held_sessions
from capabilities.calls.availability import AVAILABILITY_GROUP
from capabilities.models import session_group


class SessionGroups:
    """The groups one consumer's channel is in, and the session it holds."""

    def __init__(self, layer: Any, channel: str) -> None:
        self._layer = layer
        self._channel = channel
        self._groups: set[str] = set()
        self.session: str | None = None

    async def hear_key(self, prefix: str) -> None:
        """Hear the revocation of this key (joined before the key is checked)."""
        await self._add(agent_keys.key_group(prefix))

    async def listen(self, session_id: str) -> None:
        """Hear the session's notes, and workers coming and going."""
        await self._add(session_group(session_id))
        await self._add(AVAILABILITY_GROUP)

    async def stop_listening(self, session_id: str) -> None:
        await self._discard(session_group(session_id))

    def hold(self, session_id: str) -> None:
        """The session is this connection's."""
        self.session = session_id
        held_sessions.hold(self._channel, session_id)

    def let_go(self) -> None:
        """Stop holding the session (its notes are still heard until `leave`)."""
        held_sessions.release(self._channel)

    async def leave(self) -> None:
        """Let the session go and leave every group."""
        self.let_go()
        for group in sorted(self._groups):
            await self._discard(group)

    async def _add(self, group: str) -> None:
        await self._layer.group_add(group, self._channel)
        self._groups.add(group)

    async def _discard(self, group: str) -> None:
        self._groups.discard(group)
        await self._layer.group_discard(group, self._channel)
