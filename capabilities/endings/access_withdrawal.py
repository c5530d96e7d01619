"""Access withdrawn from open sessions: their calls cancelled, their connections closed.

One way for every withdrawal: an agent key revoked (key_revocation.py), a user
deactivated or deleted (user_deactivation.py); revoking an OAuth token can be one
more, with a reason of its own in protocol/closes.py.

First the calls in flight are settled as cancelled, source operator, with the
withdrawal's reason (`WITHDRAWN_BECAUSE`). Then every connection holding one of the
sessions is told over the channel layer (`agent.key_revoked`, with the stable close
reason), in the session's group and in any group named besides (a key's: its
connections not in a session yet). An ABP or JSON-RPC connection answers each call it
has not answered (`cancelled: true`), sends the refusal and closes
(session/machine.py, `key_revoked`); an MCP stateful session closes
(mcp_door/call_watch.py). The notes leave after the cancels, so a call's settle is
heard before the close. A session nobody holds (dropped, waiting for a resume) is
ended here: nobody may resume it.

Every step is idempotent: what fails part way (Redis, the database) is done again by
the reaper's sweeps of the modules that withdraw (`finish_*`).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet
from django.utils import timezone

from capabilities.endings import cancellation
from capabilities.jobs import notes
from capabilities.models import (
    ACTIVE_STATUSES,
    AgentSession,
    CancelSource,
    Door,
    Job,
    session_group,
)
from capabilities.protocol.closes import WITHDRAWN_BECAUSE

# Doors whose sessions a connection holds (an `app` session has none to close).
CONNECTED_DOORS = (Door.ABP, Door.RPC, Door.MCP)


def withdraw(
    reason: str,
    sessions: QuerySet[AgentSession],
    *,
    jobs: QuerySet[Job] | None = None,
    groups: Iterable[str] = (),
) -> bool:
    """Cancel the calls of `sessions` (or `jobs`, if given), then close their connections.

    `reason`: a close reason of `WITHDRAWN_BECAUSE`; `groups`: more channel-layer
    groups to tell. False if a group could not be told (Redis away): the caller's
    sweep tells it again.
    """
    because = WITHDRAWN_BECAUSE[reason]
    calls = jobs if jobs is not None else Job.objects.filter(session__in=sessions)
    for job_id in calls.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True):
        cancellation.cancel(job_id, source=CancelSource.OPERATOR, reason=because)
    open_rows = sessions.filter(closed_at__isnull=True, per_call=False, door__in=CONNECTED_DOORS)
    open_rows.filter(detached_at__isnull=False).update(
        closed_at=timezone.now(), close_reason=because
    )
    held = open_rows.filter(detached_at__isnull=True).values_list("id", flat=True)
    note = notes.agent_key_revoked(reason)
    told = [notes.notify_group(group, note) for group in [*groups, *map(session_group, held)]]
    return all(told)
