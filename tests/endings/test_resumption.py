"""Which sessions the reaper ends: nobody held them for the grace period."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from capabilities.endings import resumption
from capabilities.models import AgentSession

# The reaper reads which Daphnes are alive from Redis.
pytestmark = [pytest.mark.usefixtures("database"), pytest.mark.stack]


def session_seen(seconds_ago: float) -> AgentSession:
    return AgentSession.objects.create(
        agent_name="unit", seen_at=timezone.now() - timedelta(seconds=seconds_ago)
    )


def closed(session: AgentSession) -> bool:
    return AgentSession.objects.get(pk=session.pk).closed_at is not None


def test_sessions_unseen_for_the_grace_period_are_ended() -> None:
    with override_settings(ABP={**settings.ABP, "RESUME_GRACE_SECONDS": 60}):
        fresh, old = session_seen(30), session_seen(61)
        resumption.expire_abandoned()
    assert not closed(fresh)
    assert closed(old)
    assert AgentSession.objects.get(pk=old.pk).close_reason == resumption.EXPIRED_REASON


def test_with_resuming_off_only_a_dead_daphnes_sessions_are_ended() -> None:
    # Grace 0: live consumers still say they hold their sessions, every 10 s.
    with override_settings(ABP={**settings.ABP, "RESUME_GRACE_SECONDS": 0}):
        live, dead = session_seen(1), session_seen(31)
        resumption.expire_abandoned()
        assert resumption.keep_alive_interval() == 10.0
    assert not closed(live)
    assert closed(dead)
