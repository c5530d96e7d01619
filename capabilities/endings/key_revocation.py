"""Revoking agent keys: their calls are cancelled and their connections closed.

A withdrawal of access (access_withdrawal.py), as a user's deactivation is: on every
door, its connections answer their calls and close with `key-revoked` (4403).
"""

from __future__ import annotations

import logging

from django.db.models import Q, QuerySet
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.endings import access_withdrawal, resumption
from capabilities.models import ACTIVE_STATUSES, AgentKey, AgentSession

logger = logging.getLogger(__name__)

REASON = "key-revoked"
BATCH = 50


def revoke(keys: QuerySet[AgentKey]) -> int:
    """Revoke keys: their open connections are closed and their calls cancelled.

    Returns how many were revoked (already revoked ones are skipped). Calls in
    flight are settled as cancelled by an operator (the agent hears `cancelled:
    true` before its connection closes); sessions on any Daphne hear of it through
    the channel layer. Whatever fails part way (Redis, the database) is finished by
    the reaper (`finish_revocations`).
    """
    revoked = list(keys.filter(revoked_at__isnull=True))
    now = timezone.now()
    for key in revoked:
        AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now)
        _end_calls_and_connections(key)
    return len(revoked)


def finish_revocations() -> int:
    """Finish revocations left half done: calls still active, connections not told.

    The reaper's sweep. A connection holding a session of a revoked key (seen by its
    Daphne lately) is told again; one told already has closed its session. Returns
    how many keys it finished.
    """
    live_since = timezone.now() - resumption.held_lapses_after()
    unfinished = (
        AgentKey.objects.filter(revoked_at__isnull=False)
        .filter(
            Q(sessions__jobs__status__in=ACTIVE_STATUSES)
            | Q(
                sessions__closed_at__isnull=True,
                sessions__detached_at__isnull=True,
                sessions__seen_at__gte=live_since,
            )
        )
        .distinct()[:BATCH]
    )
    keys = list(unfinished)
    for key in keys:
        logger.warning("Finishing the revocation of key %s", key)
        _end_calls_and_connections(key)
    return len(keys)


def _end_calls_and_connections(key: AgentKey) -> None:
    sessions = AgentSession.objects.filter(agent_key=key)
    # Its key's group too: a connection not in a session yet hears it there.
    if not access_withdrawal.withdraw(REASON, sessions, groups=[agent_keys.key_group(key.prefix)]):
        logger.error("Could not tell the connections of key %s that it was revoked", key)
