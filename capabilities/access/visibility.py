"""What a principal is shown: the capabilities it may call.

`initialize-result`, `capabilities/list` and MCP's `tools/list` list only these. A
key's scopes and the page-token list decide without I/O; a capability that declares
permissions is shown only to a user who has them (one database hop for all of them,
and none when no capability declares any). The start checks every call again.
"""

from __future__ import annotations

from channels.db import database_sync_to_async

from capabilities.access import permissions
from capabilities.access.principal import Principal
from capabilities.work import registry
from capabilities.work.users import load_user


def names_for(principal: Principal) -> frozenset[str]:
    """The names of the capabilities this principal may call (may read the database)."""
    specs = [spec for spec in registry.all_specs() if principal.may_call(spec.name)]
    guarded = [spec for spec in specs if spec.permissions]
    user = load_user(principal.user_id) if guarded and principal.user_id is not None else None
    return frozenset(
        spec.name
        for spec in specs
        if not spec.permissions or permissions.user_refusal(spec, user) is None
    )


async def names_for_async(principal: Principal) -> frozenset[str]:
    """`names_for`, from the event loop: the database thread only when a user's
    permissions must be read."""
    needs_user = principal.user_id is not None and any(
        spec.permissions for spec in registry.all_specs()
    )
    if needs_user:
        names: frozenset[str] = await database_sync_to_async(names_for)(principal)
        return names
    return names_for(principal)
