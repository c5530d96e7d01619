"""Agent keys in the admin: create (the key is shown once), edit limits, revoke."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from capabilities.access import agent_keys
from capabilities.endings import key_revocation
from capabilities.models import AgentKey


@admin.register(AgentKey)
class AgentKeyAdmin(admin.ModelAdmin[AgentKey]):
    """Keys by name and prefix; revoking closes their connections and cancels their calls."""

    list_display = (
        "name",
        "owner",
        "shown_prefix",
        "key_state",
        "created_at",
        "last_used_at",
        "max_concurrent_calls",
        "max_queued_calls",
        "calls_per_minute",
        "max_open_sessions",
        "session_count",
    )
    list_filter = ("revoked_at",)
    search_fields = ("name", "=prefix", "owner__username")
    raw_id_fields = ("owner",)
    fields = (
        "name",
        "owner",
        "scopes",
        "max_concurrent_calls",
        "max_queued_calls",
        "calls_per_minute",
        "max_open_sessions",
        "shown_prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    readonly_fields = ("shown_prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke_selected",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentKey]:
        return super().get_queryset(request).annotate(session_total=Count("sessions"))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoke instead: a deleted key's sessions would lose who opened them.
        return False

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions are shown (and warns about an override that
        # takes no such parameter); 5.2 and 6.0 know no such argument.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location)  # type: ignore[call-arg,unused-ignore]
        if not self.has_change_permission(request):
            actions.pop("revoke_selected", None)
        return actions

    @admin.display(description="key")
    def shown_prefix(self, key: AgentKey) -> str:
        return f"abp_{key.prefix}_…" if key.prefix else "-"

    @admin.display(description="state")
    def key_state(self, key: AgentKey) -> SafeString:
        colour, label = ("#b02a37", "revoked") if key.is_revoked else ("#146c43", "active")
        return format_html('<span style="color:{}">{}</span>', colour, label)

    @admin.display(description="sessions")
    def session_count(self, key: AgentKey) -> int:
        return int(getattr(key, "session_total", 0))

    def save_model(self, request: HttpRequest, obj: AgentKey, form: Any, change: bool) -> None:
        if not change:
            # Kept on the instance only until response_add renders it, never stored.
            obj._plaintext = agent_keys.assign_secret(obj)  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: AgentKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """Show the new key on this response alone (not in a message: those are stored)."""
        context = {
            **self.admin_site.each_context(request),
            "key": obj,
            "plaintext": obj._plaintext,  # type: ignore[attr-defined]
            "opts": self.opts,
        }
        return TemplateResponse(request, "admin/capabilities/agentkey/created.html", context)

    @admin.action(description="Revoke selected keys (closes their connections)")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[AgentKey]) -> None:
        count = key_revocation.revoke(queryset)
        self.message_user(
            request,
            f"Revoked {count} key(s): their connections were closed, their calls cancelled.",
            messages.SUCCESS,
        )
