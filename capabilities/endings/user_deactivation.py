"""Deactivating or deleting a user: their sessions close on every door, within seconds.

`is_active` saved False (it was True), or the user deleted, withdraws the access of
everything acting for them (access_withdrawal.py), as revoking a key does for its
connections. Their calls in flight are cancelled (source operator, "user
deactivated"), their jobs started from Django code among them. The connections
holding their sessions (ABP and JSON-RPC WebSockets, MCP stateful sessions, their
pages') answer what is left and close with `user-inactive` (4403); so do their keys'
connections not in a session yet. Sessions waiting for a resume are ended.

The signals (wired in apps.py) act once the save or the delete is committed. A
withdrawal left half done, or a deactivation that sent no signal (`QuerySet.update`),
is finished by the reaper's sweep (`finish_deactivations`). Every connection is
closed within `closed_within()` seconds of the commit.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db import transaction
from django.db.models import Q
from django.db.models.signals import post_save, pre_delete, pre_save
from django.utils import timezone

from capabilities.access import agent_keys
from capabilities.conf import abp_settings
from capabilities.endings import access_withdrawal, resumption
from capabilities.models import ACTIVE_STATUSES, AgentKey, AgentSession, Job

logger = logging.getLogger(__name__)

REASON = "user-inactive"
# How the sessions and jobs of a user's keys (and tokens) name them (Principal.rate_limit_id).
USER_PRINCIPAL = "user:"
BATCH = 50
# Past the reaper's sweeps: for the note to travel, and the connection to answer and close.
SLACK_SECONDS = 1.0
# What `pre_save` read of a user about to be saved, for `post_save`.
_WAS_ACTIVE = "_abp_was_active"


def closed_within() -> float:
    """Seconds within which a deactivated user's connections are closed, from the commit.

    The note reaches them at once. One lost (Redis restarting) is sent again by the
    reaper's sweep every REAPER_INTERVAL_SECONDS: two intervals, as the sweep may
    have just passed, and the slack.
    """
    return 2 * abp_settings().REAPER_INTERVAL_SECONDS + SLACK_SECONDS


def withdrawal_due(*, was_active: bool | None, is_active: bool) -> bool:
    """Whether a save deactivated the user: active before it (None: new), not after."""
    return was_active is True and not is_active


def saves_is_active(update_fields: Iterable[str] | None) -> bool:
    """Whether a save may change `is_active` (a login saves `last_login` alone)."""
    return update_fields is None or "is_active" in update_fields


@dataclass(frozen=True, kw_only=True)
class ActingFor:
    """What acts for a user: their open sessions, their calls in flight, their keys."""

    sessions: tuple[uuid.UUID, ...]
    jobs: tuple[uuid.UUID, ...]
    key_prefixes: tuple[str, ...]

    @classmethod
    def read(cls, user_id: int) -> ActingFor:
        """Read now (before a delete nulls the rows' user, and takes the keys away)."""
        principal = f"{USER_PRINCIPAL}{user_id}"
        sessions = AgentSession.objects.filter(Q(user_id=user_id) | Q(principal=principal))
        jobs = Job.objects.filter(Q(user_id=user_id) | Q(principal=principal))
        return cls(
            sessions=tuple(sessions.filter(closed_at__isnull=True).values_list("id", flat=True)),
            jobs=tuple(jobs.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True)),
            key_prefixes=tuple(
                AgentKey.objects.filter(owner_id=user_id).values_list("prefix", flat=True)
            ),
        )

    def withdraw(self) -> bool:
        """Cancel the calls, close the sessions; False if a connection was not told."""
        return access_withdrawal.withdraw(
            REASON,
            AgentSession.objects.filter(pk__in=self.sessions),
            jobs=Job.objects.filter(pk__in=self.jobs),
            groups=[agent_keys.key_group(prefix) for prefix in self.key_prefixes],
        )


def withdraw_user(user_id: int) -> bool:
    """Cancel a user's calls and close their sessions on every door, as when deactivated.

    For any other reason to take a user's access away too. False if a connection could
    not be told (the reaper tells it again, if the user is inactive or gone by then).
    """
    return ActingFor.read(user_id).withdraw()


def finish_deactivations() -> int:
    """The reaper's sweep: what still acts for an inactive or deleted user is withdrawn.

    Calls in flight are cancelled, sessions held lately are told again, dropped ones
    are ended. A user's row gone leaves their keys' sessions and jobs a `user:`
    principal with no user. Returns how many sessions and jobs it found.
    """
    gone = Q(user__isnull=True, principal__startswith=USER_PRINCIPAL)
    if has_is_active():
        gone |= Q(user__is_active=False)
    live_since = timezone.now() - resumption.held_lapses_after()
    sessions = AgentSession.objects.filter(
        gone,
        closed_at__isnull=True,
        per_call=False,
        door__in=access_withdrawal.CONNECTED_DOORS,
    ).filter(Q(detached_at__isnull=False) | Q(seen_at__gte=live_since))
    found = ActingFor(
        sessions=tuple(sessions.values_list("id", flat=True)[:BATCH]),
        jobs=tuple(
            Job.objects.filter(gone, status__in=ACTIVE_STATUSES).values_list("id", flat=True)[
                :BATCH
            ]
        ),
        key_prefixes=(),
    )
    if found.sessions or found.jobs:
        logger.warning(
            "Finishing deactivations: %d sessions, %d calls", len(found.sessions), len(found.jobs)
        )
        found.withdraw()
    return len(found.sessions) + len(found.jobs)


def has_is_active() -> bool:
    """Whether the user model stores `is_active` (a custom one may not: all are active)."""
    try:
        get_user_model()._meta.get_field("is_active")
    except FieldDoesNotExist:
        return False
    return True


# -- the signals ---------------------------------------------------------------------


def connect_signals() -> None:
    """Listen to the user model's saves and deletes (from the app's `ready()`)."""
    users = get_user_model()
    if has_is_active():
        pre_save.connect(_before_save, sender=users, dispatch_uid="abp-user-before-save")
        post_save.connect(_saved, sender=users, dispatch_uid="abp-user-saved")
    pre_delete.connect(_deleting, sender=users, dispatch_uid="abp-user-deleting")


def _before_save(
    sender: Any,
    instance: Any,
    raw: bool = False,
    using: str | None = None,
    update_fields: Iterable[str] | None = None,
    **_: Any,
) -> None:
    if raw or not saves_is_active(update_fields):
        return
    was_active = None
    if not instance._state.adding:
        stored = sender._default_manager.using(using).filter(pk=instance.pk)
        was_active = stored.values_list("is_active", flat=True).first()
    instance.__dict__[_WAS_ACTIVE] = was_active


def _saved(
    sender: Any,
    instance: Any,
    created: bool = False,
    raw: bool = False,
    using: str | None = None,
    **_: Any,
) -> None:
    was_active = instance.__dict__.pop(_WAS_ACTIVE, None)
    is_active = bool(getattr(instance, "is_active", True))
    if raw or created or not withdrawal_due(was_active=was_active, is_active=is_active):
        return
    transaction.on_commit(functools.partial(_withdraw_safely, instance.pk), using=using)


def _deleting(sender: Any, instance: Any, using: str | None = None, **_: Any) -> None:
    # Read before the delete: it nulls the rows' user and deletes the keys.
    acting = ActingFor.read(instance.pk)
    transaction.on_commit(functools.partial(_withdraw_safely, acting), using=using)


def _withdraw_safely(what: int | ActingFor) -> None:
    """After the commit: a failure is logged (the save stands) and left to the sweep."""
    try:
        acting = what if isinstance(what, ActingFor) else ActingFor.read(what)
        if not acting.withdraw():
            logger.error("Could not tell every connection of a deactivated user")
    except Exception:
        logger.exception("Withdrawing a deactivated user's access failed; the reaper finishes it")
