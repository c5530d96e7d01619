"""Revoking an app's access closes what it opened: its sessions for that user.

A token is checked at connect (and by /mcp at every request), so a WebSocket opened
with a token would otherwise outlive its revocation. When a user revokes an app
(`/o/authorized_tokens/`) or a client revokes its token (`/o/revoke_token`, RFC 7009),
and that app holds no other valid token of the user's, its sessions for the user are
withdrawn as a revoked key's are (endings/access_withdrawal.py). Refreshing a token is
not a revocation: the new token carries the sessions on.
"""

from __future__ import annotations

import hashlib
import logging

from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_refresh_token_model

from capabilities.endings import access_withdrawal
from capabilities.models import AgentSession

logger = logging.getLogger(__name__)

REASON = "token-revoked"


def grant_of(token: str) -> tuple[int, str] | None:
    """The user and client id of an access or refresh token, if it is one of ours."""
    checksum = hashlib.sha256(token.encode("utf-8")).hexdigest()
    for model in (get_access_token_model(), get_refresh_token_model()):
        found = (
            model.objects.filter(token_checksum=checksum)
            .select_related("application")
            .values_list("user_id", "application__client_id")
            .first()
        )
        if found is not None and found[0] is not None:
            return int(found[0]), str(found[1] or "")
    return None


def withdraw_if_revoked(user_id: int, client_id: str) -> bool:
    """Close the client's sessions for the user, unless it still holds a valid token.

    False if a connection could not be told now (logged; it closes at its next check).
    """
    still_valid = get_access_token_model().objects.filter(
        user_id=user_id, application__client_id=client_id, expires__gt=timezone.now()
    )
    if still_valid.exists():
        return True
    sessions = AgentSession.objects.filter(user_id=user_id, client=client_id, auth="token")
    told = access_withdrawal.withdraw(REASON, sessions)
    if not told:
        logger.warning("Revoked OAuth client %s: a connection could not be told now", client_id)
    return told
