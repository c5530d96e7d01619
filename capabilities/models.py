"""Sessions and jobs: the durable record of every call.

State changes go through `capabilities.jobs.lifecycle`; nothing else updates a job's status.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from capabilities.protocol.responses import CANCEL_SOURCE_LABELS


class JobStatus(models.TextChoices):
    """Where a job is in its life. Only QUEUED and RUNNING can still change."""

    QUEUED = "queued", "Queued"
    """Created; waiting for its agent's share of a worker (`dispatched_at` null), or
    handed to Celery and not started yet."""
    RUNNING = "running", "Running"
    """A worker marked it started and is doing the work."""
    SUCCEEDED = "succeeded", "Succeeded"
    """Settled with a result."""
    FAILED = "failed", "Failed"
    """Settled with an error (bad input found during work, a crash, a lost worker)."""
    CANCELLED = "cancelled", "Cancelled"
    """Settled as cancelled: by the agent, a timeout, a shutdown, a disconnect or an operator."""


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
SETTLED_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class CancelSource(models.TextChoices):
    """Who or what cancelled a job."""

    AGENT = "agent", CANCEL_SOURCE_LABELS["agent"]
    """The agent sent capabilities/cancel."""
    TIMEOUT = "timeout", CANCEL_SOURCE_LABELS["timeout"]
    """options.timeout ran out."""
    SHUTDOWN = "shutdown", CANCEL_SOURCE_LABELS["shutdown"]
    """The agent sent shutdown with the call in flight."""
    DISCONNECT = "disconnect", CANCEL_SOURCE_LABELS["disconnect"]
    """The agent's connection dropped with the call in flight."""
    OPERATOR = "operator", CANCEL_SOURCE_LABELS["operator"]
    """An operator cancelled it in the admin."""
    USER = "user", CANCEL_SOURCE_LABELS["user"]
    """The job's own user cancelled it: on "Your jobs", its API or the CLI."""


class Door(models.TextChoices):
    """The front door a session came in by."""

    ABP = "abp", "ABP"
    """The ABP WebSocket (/abp/ws), the embed bridge or window.abp."""
    MCP = "mcp", "MCP"
    """MCP's Streamable HTTP endpoint (/mcp)."""
    RPC = "rpc", "JSON-RPC"
    """The JSON-RPC WebSocket (/abp/rpc), with ACP's `$/cancel_request`."""
    APP = "app", "Django code"
    """Started by the host's own code: `capability.enqueue(params, user=...)`."""


class AgentKey(models.Model):
    """A credential an agent opens WebSockets with. Only its hash is stored.

    The key is `abp_<prefix>_<secret>`; the prefix finds the row and is shown in the
    admin, the secret's SHA-256 is compared in constant time (keys are random, 256
    bits: a slow password hash would add nothing but latency to every connect).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, help_text="Who holds it, for the admin.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="abp_agent_keys",
        help_text="The user the key's calls run for (ctx.user), with that user's "
        "permissions; empty: a service key, which runs for nobody.",
    )
    scopes = models.JSONField(
        default=list,
        blank=True,
        help_text="The capabilities this key may call (a list of names); empty: every "
        "capability its user may call. Scopes narrow a user's rights, never widen them.",
    )
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    max_concurrent_calls = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Jobs of this key running at once (its share of the workers); "
        "empty: the default.",
    )
    max_queued_calls = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Calls queued or running in one session; empty: the default.",
    )
    calls_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Calls per minute for this key; empty: the default."
    )
    max_open_sessions = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Sessions of this key open at once (held, or waiting for a resume), "
        "across every door; empty: the default.",
    )

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.name} (abp_{self.prefix}_…)"

    @property
    def is_revoked(self) -> bool:
        """Revoked keys open nothing, and their open connections were closed."""
        return self.revoked_at is not None


class AgentSession(models.Model):
    """One ABP session: created by initialize, ended by shutdown or disconnect."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent_name = models.CharField(max_length=200, blank=True)
    agent_version = models.CharField(max_length=100, blank=True)
    protocol_version = models.CharField(max_length=20, blank=True)
    features = models.JSONField(default=dict, blank=True)
    origin = models.CharField(max_length=300, blank=True)
    agent_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions"
    )
    # How the connection authenticated: key, token (OAuth), page (a page token) or
    # anonymous.
    auth = models.CharField(max_length=10, blank=True)
    door = models.CharField(max_length=10, choices=Door.choices, default=Door.ABP)
    client_address = models.CharField(max_length=100, blank=True)
    # Whose budgets the session spends (access/principal.py, rate_limit_id): a key, or
    # the client address of page-token and anonymous connections.
    principal = models.CharField(max_length=120, blank=True)
    # The user the session acts for (the principal's): a resume and a deactivation are
    # bound to it. Null for a service key, an anonymous page or development mode.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="abp_sessions",
    )
    # What opened it for the user: an agent key's prefix or an OAuth client's id
    # (revoking that client's tokens closes its sessions: oauth/revocation.py).
    client = models.CharField(max_length=200, blank=True)
    connected_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=300, blank=True)
    # Resuming: the SHA-256 of the current resume token (a new one at every resume).
    resume_hash = models.CharField(max_length=64, blank=True)
    # Bumped by every resume: a consumer holding an older one was taken over.
    generation = models.PositiveIntegerField(default=0)
    # When the socket dropped (null while a consumer holds the session).
    detached_at = models.DateTimeField(null=True, blank=True)
    # Refreshed by the consumer holding the session, set when it drops: a session
    # not seen for the grace period (its Daphne died, or nobody resumed) is ended.
    seen_at = models.DateTimeField(default=timezone.now)
    # The row of one session-less MCP call (2026-07-28): it lives as long as its call,
    # which counts as a call in flight; it is never an open session of its principal.
    per_call = models.BooleanField(default=False)

    class Meta:
        ordering = ("-connected_at",)
        indexes = (
            models.Index(fields=("-connected_at",), name="session_connected_idx"),
            # The reaper: open sessions nobody has held for the grace period.
            models.Index(fields=("closed_at", "seen_at"), name="session_open_seen_idx"),
            # Open sessions per principal (MAX_OPEN_SESSIONS_PER_PRINCIPAL).
            models.Index(fields=("principal", "closed_at"), name="session_principal_open_idx"),
        )

    def __str__(self) -> str:
        return f"{self.agent_name or 'agent'} {self.id}"


def session_group(session_id: uuid.UUID | str) -> str:
    """Channel-layer group name of a session (letters, digits, dots only)."""
    return f"abp.session.{uuid.UUID(str(session_id)).hex}"


class Job(models.Model):
    """One capability call, run as one Celery task whose id is the job's id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="jobs")
    call_id = models.CharField(max_length=200)
    # The request's id as its door keeps it: ABP's as sent (200 characters at most),
    # JSON-RPC's as JSON text (a 200-character string, escaped, plus its quotes).
    request_id = models.CharField(max_length=1210, blank=True)
    capability = models.CharField(max_length=100)
    params = models.JSONField(default=dict)
    # Parameters kept in storage instead of the row (capabilities.jobs.inputs): the
    # parameter's name -> its file. Never agent data, so agents cannot name a file.
    spilled = models.JSONField(default=dict, blank=True)
    # Copied from the session: calls in flight per principal are counted on it.
    principal = models.CharField(max_length=120, blank=True)
    # The user the call runs for (ctx.user): its agent key's owner, or the signed-in
    # user of the page; null for a service key or an anonymous page.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="abp_jobs",
    )
    # Who made the call for the user: an agent key's prefix or an OAuth client's id
    # ("" for a page or Django code). Shown on "Your jobs" and in the admin.
    client = models.CharField(max_length=200, blank=True)
    # The Celery queue the job runs from, and the principal's share of the workers
    # (jobs running at once) when it was created: the dispatcher reads both.
    queue = models.CharField(max_length=100, blank=True)
    max_running = models.PositiveIntegerField(default=0)
    # When it was handed to Celery; null while it waits in the database for a
    # free worker slot within its principal's share (capabilities/jobs/dispatch.py).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    progress_token = models.JSONField(null=True, blank=True)
    # A digest of the capability and its params: the same callId with the same call
    # adopts this job instead of refusing it as a reused id (an idempotency key).
    params_hash = models.CharField(max_length=64, blank=True, default="")
    # The agent asked for notifications: the worker announces the start.
    notify_started = models.BooleanField(default=False)

    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.QUEUED)
    progress = models.FloatField(null=True, blank=True)
    progress_total = models.FloatField(null=True, blank=True)
    stage = models.CharField(max_length=100, blank=True)

    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=50, blank=True)
    error_message = models.TextField(blank=True)
    error_retryable = models.BooleanField(default=False)
    error_details = models.JSONField(null=True, blank=True)
    error_traceback = models.TextField(blank=True)
    cancel_source = models.CharField(max_length=10, choices=CancelSource.choices, blank=True)
    cancel_reason = models.CharField(max_length=500, blank=True)

    deadline = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The session generation whose connection claimed the sending (a fencing token):
    # a newer generation may take the claim over, and only its holder gives it back.
    delivered_generation = models.PositiveIntegerField(null=True, blank=True)
    hard_killed = models.BooleanField(default=False)
    # Written every few seconds while a worker runs the job; a stale one means the
    # worker is gone (the reaper then fails the job with WORKER_LOST).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # The call's span (a W3C traceparent), written only while traces are on
    # (capabilities/tracing.py): dispatch, the worker, the settle and the delivery
    # join the call's trace from it, in whichever process and however much later.
    trace_parent = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ("-created_at",)
        constraints = (
            models.UniqueConstraint(fields=("session", "call_id"), name="job_call_id_per_session"),
        )
        indexes = (
            # The reaper: active jobs past their deadline.
            models.Index(fields=("status", "deadline"), name="job_status_deadline_idx"),
            # The reaper: running jobs whose heartbeat went stale.
            models.Index(fields=("status", "heartbeat_at"), name="job_status_heartbeat_idx"),
            # The reaper: cancelled jobs whose worker has not stopped yet.
            models.Index(fields=("status", "stopped_at"), name="job_status_stopped_idx"),
            models.Index(fields=("-created_at",), name="job_created_idx"),
            # The admin's filters, each with its newest-first order.
            models.Index(fields=("status", "-created_at"), name="job_status_created_idx"),
            models.Index(fields=("capability", "-created_at"), name="job_capability_created_idx"),
            models.Index(fields=("cancel_source", "-created_at"), name="job_cancel_created_idx"),
            # The admin's search by callId alone.
            models.Index(fields=("call_id",), name="job_call_id_idx"),
            # The reaper: results settled but not sent (resumption.nudge_undelivered).
            models.Index(fields=("delivered_at", "settled_at"), name="job_undelivered_idx"),
            # Calls in flight per principal (MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL).
            models.Index(fields=("principal", "status"), name="job_principal_status_idx"),
            # The dispatcher: jobs waiting for a slot on a queue, oldest first.
            models.Index(
                fields=("status", "queue", "dispatched_at", "created_at"),
                name="job_dispatch_idx",
            ),
            # "Your jobs": a user's jobs, newest first.
            models.Index(fields=("user", "-created_at"), name="job_user_created_idx"),
            # /metrics: jobs settled within its window (capabilities/web/metrics_collector.py).
            models.Index(fields=("settled_at",), name="job_settled_idx"),
        )

    def __str__(self) -> str:
        return f"{self.capability} {self.call_id}"

    @property
    def is_active(self) -> bool:
        """Still queued or running: its outcome is not decided yet."""
        return self.status in ACTIVE_STATUSES
