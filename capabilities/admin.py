"""Read-only admin views of sessions and jobs (operators' tools come with their own issue)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from capabilities.models import AgentSession, Job


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    """No add, change or delete: state changes go through capabilities.jobs."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs, newest first."""

    list_display = (
        "call_id",
        "capability",
        "status",
        "stage",
        "cancel_source",
        "created_at",
        "started_at",
        "settled_at",
        "stopped_at",
        "worker",
    )
    list_filter = ("status", "capability", "cancel_source")
    search_fields = ("call_id", "session__id")
    list_select_related = ("session",)


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyAdmin):
    """Sessions, newest first."""

    list_display = ("id", "agent_name", "agent_version", "origin", "connected_at", "closed_at")
    search_fields = ("id", "agent_name")
