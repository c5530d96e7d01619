"""The scopes the authorization server knows: `jobs`, and each capability's own.

`@capability(..., scopes=["notes:export"])` declares one; it is offered here (and in
the Protected Resource Metadata), described by the capabilities that need it.
"""

from __future__ import annotations

from typing import Any

from oauth2_provider.scopes import SettingsScopes

from capabilities.work import registry


class CapabilityScopes(SettingsScopes):  # type: ignore[misc]
    """The toolkit's `SCOPES` setting, plus every scope a capability declares."""

    def get_all_scopes(self) -> dict[str, str]:
        found: dict[str, str] = dict(super().get_all_scopes())
        needing: dict[str, list[str]] = {}
        for spec in registry.all_specs():
            for scope in spec.scopes:
                needing.setdefault(scope, []).append(spec.name)
        for scope, names in needing.items():
            found.setdefault(scope, "Call " + ", ".join(sorted(names)))
        return found

    def get_available_scopes(self, *args: Any, **kwargs: Any) -> list[str]:
        return list(self.get_all_scopes())
