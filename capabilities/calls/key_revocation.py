"""Revoking agent keys: their calls are cancelled and their connections closed."""

from __future__ import annotations

import logging

from django.db.models import QuerySet
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.calls import cancellation
from capabilities.jobs import notes
from capabilities.models import ACTIVE_STATUSES, AgentKey, CancelSource, Job

logger = logging.getLogger(__name__)

REVOKED_REASON = "agent key revoked"


def revoke(keys: QuerySet[AgentKey]) -> int:
    """Revoke keys: their open connections are closed and their calls cancelled.

    Returns how many were revoked (already revoked ones are skipped). Calls in
    flight are settled as cancelled by an operator (the agent hears `cancelled:
    true` before its connection closes); sessions on any Daphne hear of it through
    the channel layer.
    """
    revoked = list(keys.filter(revoked_at__isnull=True))
    now = timezone.now()
    for key in revoked:
        AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now)
        active = Job.objects.filter(session__agent_key=key, status__in=ACTIVE_STATUSES).values_list(
            "id", flat=True
        )
        for job_id in active:
            cancellation.cancel(job_id, source=CancelSource.OPERATOR, reason=REVOKED_REASON)
        if not notes.notify_group(agent_keys.key_group(key.prefix), notes.agent_key_revoked()):
            logger.error("Could not tell the connections of key %s that it was revoked", key)
    return len(revoked)
