"""Revoking agent keys: their calls are cancelled and their connections closed."""

from __future__ import annotations

import logging

from django.db.models import Q, QuerySet
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.calls import cancellation, resumption
from capabilities.jobs import notes
from capabilities.models import ACTIVE_STATUSES, AgentKey, CancelSource, Job

logger = logging.getLogger(__name__)

REVOKED_REASON = "agent key revoked"
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
    active = Job.objects.filter(session__agent_key=key, status__in=ACTIVE_STATUSES).values_list(
        "id", flat=True
    )
    for job_id in active:
        cancellation.cancel(job_id, source=CancelSource.OPERATOR, reason=REVOKED_REASON)
    if not notes.notify_group(agent_keys.key_group(key.prefix), notes.agent_key_revoked()):
        logger.error("Could not tell the connections of key %s that it was revoked", key)
