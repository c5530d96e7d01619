"""What an ABP agent sends again after a resume: one function, for either server.

Without the `heldCalls` extension, every call last sent on a lost socket and never
answered is sent again with the same callId; a call the server already had is refused
(INVALID_PARAMS on payload.options.callId) and still answered once by its own result.
With it, the agent lists the calls it still waits on (`resume.awaiting`), the server
says which it holds (`initialize-result.heldCalls`), and only the others are sent
again, marked `options.resent`: never refused, never run twice.
"""

from __future__ import annotations

from typing import Any

from tests.support.fleet import Call

# The server speaks the extension (since fa376af); False gives the older agent's way.
HELD_CALLS = True


def awaiting(calls: dict[str, Call]) -> list[str]:
    """The calls sent and not answered yet (resume.awaiting)."""
    return [call.call_id for call in calls.values() if call.sends and not call.results]


def to_send_again(
    calls: dict[str, Call], lost: set[int], initialized: dict[str, Any]
) -> list[Call]:
    """The calls to send again after a resume, given its initialize-result's payload."""
    held = initialized.get("heldCalls")
    if held is None:
        return [
            call
            for call in calls.values()
            if not call.answers and call.sends and call.sends[-1].connection in lost
        ]
    return [c for c in calls.values() if c.sends and not c.results and c.call_id not in set(held)]
