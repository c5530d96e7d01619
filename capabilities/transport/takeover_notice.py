"""Telling a session's old connection that a resume took the session over.

The notice goes out after the new resume token is committed and before the reply
that carries it. If the channel layer refuses it (Redis restarting), the reply must
still go out: a resume that failed there would leave the agent with a token that no
longer works, and its session lost with every call it waits for. The old connection
is told later instead, in the background, until the grace period ends; meanwhile
each result is still claimed once in the database, so it is sent on one connection
only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from capabilities.conf import abp_settings
from capabilities.jobs import notes, outages
from capabilities.models import session_group

logger = logging.getLogger(__name__)


async def announce(layer: Any, session_id: str, generation: int) -> bool:
    """Send the notice once; False if the channel layer refused it."""
    try:
        await layer.group_send(session_group(session_id), notes.session_superseded(generation))
    except outages.REDIS_AWAY:  # the channel layer's errors are its backend's
        logger.warning("Could not tell session %s's old connection yet", session_id)
        return False
    return True


async def keep_announcing(layer: Any, session_id: str, generation: int) -> None:
    """Send it again until it is taken, or the old connection's grace is over."""
    deadline = asyncio.get_running_loop().time() + abp_settings().RESUME_GRACE_SECONDS
    for pause in outages.pauses():
        await asyncio.sleep(pause)
        if await announce(layer, session_id, generation):
            return
        if asyncio.get_running_loop().time() > deadline:
            logger.error("Session %s's old connection was never told of its takeover", session_id)
            return
