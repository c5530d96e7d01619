"""System checks: what production refuses to start with that settings alone cannot see.

Settings refuse unsafe values as they load (`abpsite.safety`); an account that
still logs in with the development password lives in the database, so it is a
system check, as is a local lane whose runs would outlive the reaper's
patience. Daphne runs no checks itself: the web commands (Procfile, the
image's CMD, docker-compose.yml) run `manage.py check` before it, and `migrate`
runs it too.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password
from django.core import checks
from django.db import DatabaseError, connections, router

from capabilities.conf import abp_settings
from capabilities.work import extras

# Each password check costs one full hash (~0.3-0.5 s): the development superuser's
# name, then at most this many other active superusers.
MAX_SUPERUSERS_CHECKED = 5


def development_password_in_use(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """In production, an Error per active account whose password is the development one."""
    if settings.DEVELOPMENT:
        return []
    try:
        usernames = _accounts_with_development_password()
    except DatabaseError as error:
        return [
            checks.Warning(
                f"Could not look for accounts with the development password: {error}",
                id="capabilities.W001",
            )
        ]
    return [
        checks.Error(
            f"The active account {username!r} logs in with the development password "
            "(DJANGO_DEV_SUPERUSER_PASSWORD); production refuses to start.",
            hint=f"Change it (manage.py changepassword {username}) or deactivate the account.",
            id="capabilities.E001",
        )
        for username in usernames
    ]


def _accounts_with_development_password() -> list[str]:
    users = get_user_model()
    alias = router.db_for_read(users)
    if users._meta.db_table not in connections[alias].introspection.table_names():
        return []  # not migrated yet: no accounts
    name_field = users.USERNAME_FIELD
    active = users._default_manager.db_manager(alias).filter(is_active=True)
    development = active.filter(**{name_field: settings.DEV_SUPERUSER_USERNAME})
    superusers = active.filter(is_superuser=True).exclude(
        **{name_field: settings.DEV_SUPERUSER_USERNAME}
    )
    candidates = [
        *development.values_list(name_field, "password"),
        *superusers.order_by("pk").values_list(name_field, "password")[:MAX_SUPERUSERS_CHECKED],
    ]
    # The module function, not user.check_password: that one may re-hash and save.
    return [
        str(username)
        for username, encoded in candidates
        if check_password(settings.DEV_SUPERUSER_PASSWORD, encoded)
    ]


def local_lane_time_limit(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """An Error if local runs may last as long as a dead worker is waited for."""
    abp = abp_settings()
    limit, lost_after = abp.LOCAL_LANE_TIME_LIMIT_SECONDS, abp.WORKER_LOST_AFTER_SECONDS
    if abp.LOCAL_LANE_PROCESSES <= 0 or limit < lost_after:
        return []
    return [
        checks.Error(
            f"ABP_LOCAL_LANE_TIME_LIMIT_SECONDS ({limit}) must be under "
            f"ABP_WORKER_LOST_AFTER_SECONDS ({lost_after}): the reaper would fail a local "
            "run still going as WORKER_LOST.",
            hint="Lower the lane's time limit, or turn the lane off (ABP_LOCAL_LANE_PROCESSES=0).",
            id="capabilities.E002",
        )
    ]


def built_ins_switched_off(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """An Info per built-in capability that is not served because its extra is missing."""
    off = ((built_in, built_in.missing_modules()) for built_in in extras.BUILT_INS.values())
    return [
        checks.Info(
            f"The built-in capability {built_in.name!r} is off: the {built_in.extra!r} extra "
            f"is not installed ({', '.join(missing)} not found).",
            hint=f"To serve it: {built_in.install_line}",
            id="capabilities.I001",
        )
        for built_in, missing in off
        if missing
    ]
