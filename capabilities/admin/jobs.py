"""The operators' view of jobs and sessions: read-only, except for cancelling.

Cancelling here goes through the same settle as an agent's cancel
(`cancellation.cancel`, source `operator`): the agent hears `cancelled: true`
and the worker stops. Nothing else about a job can be added, edited or deleted.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.files.storage import default_storage
from django.db.models import Count, Q, QuerySet
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from capabilities.admin import display, workers
from capabilities.admin.summary import changelist_summary
from capabilities.endings import cancellation
from capabilities.jobs.results import FILE_REF_KEY
from capabilities.models import ACTIVE_STATUSES, AgentSession, CancelSource, Job, JobStatus
from capabilities.work import registry


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


class CapabilityFilter(admin.SimpleListFilter):
    """The registry's capabilities (no DISTINCT over the whole table)."""

    title = "capability"
    parameter_name = "capability"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(spec.name, spec.name) for spec in registry.all_specs()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(capability=value) if value else queryset


class UserFilter(admin.SimpleListFilter):
    """Jobs of one user, or of none; offered: the users of the latest jobs.

    Not every user of the site (a host may have millions): those of the last
    RECENT_JOBS jobs, read newest first on an index, plus the one chosen.
    """

    title = "user"
    parameter_name = "user"
    NONE = "none"
    RECENT_JOBS = 500

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Job.objects.filter(user__isnull=False).order_by("-created_at")
        ids = set(recent.values_list("user_id", flat=True)[: self.RECENT_JOBS])
        chosen = self.value()
        if chosen and chosen.isdigit():
            ids.add(int(chosen))
        users = get_user_model()._default_manager.filter(pk__in=ids)
        names = sorted((user.get_username(), str(user.pk)) for user in users)
        return [(self.NONE, "(no user)"), *((pk, name) for name, pk in names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == self.NONE:
            return queryset.filter(user__isnull=True)
        if value and value.isdigit():
            return queryset.filter(user_id=int(value))
        return queryset


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    """No add, change or delete: state changes go through capabilities.jobs.lifecycle."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# The change page's sections, every field read-only.
_SECTIONS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (
        None,
        (
            "call_id",
            "capability",
            "user",
            "client",
            "door",
            "session_link",
            "status_badge",
            "queue",
            "worker",
        ),
    ),
    ("Progress", ("progress_bar", "stage")),
    ("Timeline", ("timeline", "ran_after_cancel", "hard_killed")),
    ("Input", ("params_summary", "progress_token", "deadline")),
    ("Outcome", ("result_summary", "error_summary", "traceback_block")),
    ("Cancel", ("cancel_source", "cancel_reason")),
)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs, newest first, with progress, timing and a cancel the agent hears."""

    list_display = (
        "call_id",
        "capability",
        "user",
        "client",
        "door",
        "session_link",
        "status_badge",
        "progress_bar",
        "created_at",
        "time_queued",
        "run_time",
        "worker",
        "cancel_source",
    )
    list_filter = (
        "status",
        CapabilityFilter,
        UserFilter,
        "session__door",
        "cancel_source",
        "created_at",
    )
    # callId, session id or the start of the agent's name: see get_search_results.
    search_fields = ("call_id",)
    search_help_text = (
        "A callId, a session id, the start of an agent's name, or a user's exact username."
    )
    list_select_related = ("session", "user")
    ordering = ("-created_at",)
    list_per_page = 50
    show_full_result_count = False  # no second COUNT(*) over the whole table
    actions = ("cancel_selected",)
    change_list_template = "admin/capabilities/job/change_list.html"
    fieldsets = tuple((title, {"fields": names}) for title, names in _SECTIONS)
    # Every field shown is read-only: jobs change only through their lifecycle.
    readonly_fields = tuple(name for _, names in _SECTIONS for name in names)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # Inputs can be megabytes of base64: the list never reads them.
        queryset: QuerySet[Job] = super().get_queryset(request)
        return queryset.defer("params", "result", "error_traceback")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        # Each branch is an indexed lookup; Django's default OR across the join
        # would scan the whole table.
        term = search_term.strip()
        if not term:
            return queryset, False
        sessions = AgentSession.objects.filter(agent_name__startswith=term)
        if _is_uuid(term):
            sessions = sessions | AgentSession.objects.filter(pk=term)
        users = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: term})
        found = Q(call_id=term) | Q(session__in=sessions.values("pk")) | Q(user__in=users)
        return queryset.filter(found), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "summary": changelist_summary()}
        return super().changelist_view(request, extra_context=context)

    def get_urls(self) -> list[URLPattern]:
        own = path(
            "<uuid:job_id>/file/<str:key>/",
            self.admin_site.admin_view(self.result_file),
            name="capabilities_job_file",
        )
        return [own, workers.url(self), *super().get_urls()]

    def result_file(self, request: HttpRequest, job_id: uuid.UUID, key: str) -> HttpResponseBase:
        """A stored result file, for staff."""
        job = get_object_or_404(Job, pk=job_id)
        ref = (job.result or {}).get(key)
        if not isinstance(ref, dict) or FILE_REF_KEY not in ref:
            raise Http404("No such file")
        if not default_storage.exists(ref[FILE_REF_KEY]):
            raise Http404("No longer kept")
        return FileResponse(
            default_storage.open(ref[FILE_REF_KEY], "rb"),
            filename=ref["filename"],
            content_type=ref["mimeType"],
        )

    @admin.display(description="session")
    def session_link(self, job: Job) -> SafeString:
        return display.session_link(job.session)

    @admin.display(description="status", ordering="status")
    def status_badge(self, job: Job) -> SafeString:
        return display.status_badge(job.status, job.get_status_display())

    @admin.display(description="progress")
    def progress_bar(self, job: Job) -> SafeString:
        return display.progress_bar(job)

    @admin.display(description="queued")
    def time_queued(self, job: Job) -> str:
        return display.time_queued(job)

    @admin.display(description="run time")
    def run_time(self, job: Job) -> str:
        return display.run_time(job)

    @admin.display(description="timeline")
    def timeline(self, job: Job) -> SafeString:
        return display.timeline(job)

    @admin.display(description="door", ordering="session__door")
    def door(self, job: Job) -> str:
        return job.session.get_door_display()

    @admin.display(description="work after the cancel")
    def ran_after_cancel(self, job: Job) -> str:
        return display.ran_after_cancel(job)

    @admin.display(description="params")
    def params_summary(self, job: Job) -> SafeString:
        return display.json_block(display.summarize(job.params, job.spilled))

    @admin.display(description="result")
    def result_summary(self, job: Job) -> SafeString:
        return display.result(job)

    @admin.display(description="error")
    def error_summary(self, job: Job) -> SafeString:
        if not job.error_code:
            return format_html("{}", "-")
        return format_html(
            "<code>{}</code> {}{}",
            job.error_code,
            job.error_message,
            " (retryable)" if job.error_retryable else "",
        )

    @admin.display(description="traceback")
    def traceback_block(self, job: Job) -> SafeString:
        if not job.error_traceback:
            return format_html("{}", "-")
        return format_html("<pre class='abp-traceback'>{}</pre>", job.error_traceback)

    @admin.action(description="Cancel selected jobs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Cancel as an operator: the agent is told and the worker stops."""
        reason = f"cancelled by {request.user.get_username()} in the admin"
        active = queryset.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True)
        cancelled = sum(
            cancellation.cancel(job_id, source=CancelSource.OPERATOR, reason=reason)
            for job_id in active
        )
        skipped = queryset.count() - cancelled
        self.message_user(request, f"Cancelled {cancelled} job(s).", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"{skipped} job(s) had already finished.", messages.WARNING)


class JobInline(admin.TabularInline[Job, AgentSession]):
    """A session's jobs, newest first, read-only."""

    model = Job
    fields = ("call_id", "capability", "status", "stage", "created_at", "settled_at")
    readonly_fields = fields
    ordering = ("-created_at",)
    extra = 0
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyAdmin):
    """Sessions, newest first, with their jobs counted by status."""

    list_display = (
        "id",
        "agent_name",
        "agent_version",
        "agent_key",
        "door",
        "auth",
        "origin",
        "client_address",
        "connected_at",
        "closed_at",
        "close_reason",
        "job_counts",
    )
    list_select_related = ("agent_key",)
    search_fields = ("=id", "^agent_name", "=agent_key__prefix")
    list_filter = ("door", "per_call", "connected_at")
    ordering = ("-connected_at",)
    list_per_page = 50
    show_full_result_count = False
    inlines = (JobInline,)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentSession]:
        counts = {
            f"jobs_{status}": Count("jobs", filter=Q(jobs__status=status))
            for status in JobStatus.values
        }
        annotated: QuerySet[AgentSession] = super().get_queryset(request).annotate(**counts)
        return annotated

    @admin.display(description="jobs")
    def job_counts(self, session: AgentSession) -> SafeString:
        parts = [
            (JobStatus(status).label.lower(), getattr(session, f"jobs_{status}", 0))
            for status in JobStatus.values
        ]
        shown = [(label, count) for label, count in parts if count]
        if not shown:
            return format_html("{}", "-")
        return format_html_join(", ", "{} {}", ((count, label) for label, count in shown))
