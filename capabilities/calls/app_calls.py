"""Jobs Django code starts (`capability.enqueue()`): the checks of a call, then the job.

The port of work/enqueueing.py, installed by the app's `ready()`. A job enqueued for
a user goes through what an agent's call for that user goes through, in order,
before anything is stored: its params (JSON, no larger than a frame, the schema and
its size limits, upload references), its timeout, the user (active, the
capability's permissions and `authorize` check), a live worker for its queue, and
the user's calls in flight. The user's budget is the one their agents spend
(`user:<id>`); Django code for nobody spends one of its own (`app`). Calls per
minute are an agent's limit at the door, not the host's own code's.

Each job gets a session row of its own, of the `app` door, written closed: nobody
is connected to be answered, so the reaper neither nudges its result nor expires
it, and no disconnect cancels it. The result waits in the job's row ("Your jobs",
`get_result`, `refresh()`). Session and job are written in one transaction, the
caller's own if it has one: the job is handed to a worker when that commits, and
a rollback leaves nothing.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from capabilities.access import permissions
from capabilities.access.principal import Principal
from capabilities.calls import availability, budgets
from capabilities.conf import abp_settings
from capabilities.endings import cancellation
from capabilities.jobs import uploads
from capabilities.models import AgentSession, CancelSource, Door, Job, JobStatus
from capabilities.protocol import ErrorCode, WireError, responses
from capabilities.work import params_size, registry
from capabilities.work.enqueueing import EnqueueRefused, JobHandle, JobNotFound, user_id_of
from capabilities.work.users import load_user

if TYPE_CHECKING:
    from capabilities.work.enqueueing import User

# What an app job's row says of the call and its session.
CALL_ID = "enqueue"
AUTH = "app"
NOBODY_CONNECTED = "Django code: nobody is connected; the result waits in the job's row"
CANCEL_REASON = "cancelled by Django code (JobHandle.cancel)"


class AppPrincipal(Principal):
    """Django code acting for a user, or for nobody: no key, no scopes.

    A user's jobs share the budget of their agents' calls; jobs for nobody share one.
    """

    @property
    def rate_limit_id(self) -> str:
        """`user:<id>`, as the user's keys spend; `app` for nobody."""
        return "app" if self.user_id is None else f"user:{self.user_id}"


class AppCalls:
    """`enqueue`, `find` and `cancel` on the database; the async ones in its thread."""

    def enqueue(
        self, capability: str, params: dict[str, Any], *, user: User, timeout_ms: int | None
    ) -> JobHandle:
        """Check, then store the job (handed over on commit); EnqueueRefused if refused."""
        spec = registry.get(capability)
        if spec is None:
            raise EnqueueRefused(responses.unknown_capability(capability))
        user_id = user_id_of(user)
        principal = AppPrincipal(kind="anonymous", key=None, client_address="", user_id=user_id)
        session_id = str(uuid.uuid4())
        _refuse(_params_refusal(spec, principal, params, session_id))
        timeout = _timeout_ms(spec, timeout_ms)
        _refuse(_user_refusal(spec, user_id, params))
        _refuse(availability.unavailable(capability))
        try:
            with transaction.atomic():
                _record_session(session_id, principal)
                job = budgets.create_job(
                    principal,
                    session_id=session_id,
                    call_id=CALL_ID,
                    request_id="",
                    capability=capability,
                    params=params,
                    timeout_ms=timeout,
                    progress_token=None,
                )
        except budgets.Refused as refused:
            raise EnqueueRefused(refused.error) from None
        return handle(job)

    async def aenqueue(
        self, capability: str, params: dict[str, Any], *, user: User, timeout_ms: int | None
    ) -> JobHandle:
        """`enqueue` in the database thread (`has_perm` there, never `ahas_perm`)."""
        started: JobHandle = await database_sync_to_async(self.enqueue)(
            capability, params, user=user, timeout_ms=timeout_ms
        )
        return started

    def find(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle:
        """The job as it is now; JobNotFound unless it is this user's, of this capability."""
        job = _bound(capability, job_id, user_id).first()
        if job is None:
            raise JobNotFound(f"No job {job_id} of {capability} for this user.")
        return handle(job)

    async def afind(self, capability: str, job_id: str, *, user_id: int | None) -> JobHandle:
        """`find` in the database thread."""
        found: JobHandle = await database_sync_to_async(self.find)(
            capability, job_id, user_id=user_id
        )
        return found

    def cancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool:
        """Cancel through the one pipeline (source `user`); True if this settled it."""
        found = _bound(capability, job_id, user_id).values_list("pk", flat=True).first()
        if found is None:
            raise JobNotFound(f"No job {job_id} of {capability} for this user.")
        return cancellation.cancel(found, source=CancelSource.USER, reason=CANCEL_REASON)

    async def acancel(self, capability: str, job_id: str, *, user_id: int | None) -> bool:
        """`cancel` in the database thread."""
        won: bool = await database_sync_to_async(self.cancel)(capability, job_id, user_id=user_id)
        return won


def handle(job: Job) -> JobHandle:
    """The handle of a job row, as it is now."""
    error = None
    if job.error_code:
        error = WireError(
            code=job.error_code,
            message=job.error_message,
            retryable=job.error_retryable,
            details=job.error_details,
        )
    return JobHandle(
        id=str(job.pk),
        capability=job.capability,
        status=str(job.status),
        result=job.result if job.status == JobStatus.SUCCEEDED else None,
        error=error,
        user_id=job.user_id,
    )


def _refuse(error: WireError | None) -> None:
    if error is not None:
        raise EnqueueRefused(error)


def _params_refusal(
    spec: registry.CapabilitySpec, principal: Principal, params: Any, session_id: str
) -> WireError | None:
    """What an agent's call of these params would be refused for, or None."""
    if not isinstance(params, dict):
        return WireError(code=ErrorCode.INVALID_TYPE, message="'params' must be an object.")
    limit = abp_settings().MAX_FRAME_BYTES
    try:
        fits = params_size.json_fits(params, limit)
    except (TypeError, ValueError):
        return WireError(
            code=ErrorCode.INVALID_PARAMS,
            message="'params' must be JSON: objects, arrays, strings, numbers, booleans, null.",
            details={"path": "params"},
        )
    if not fits:
        return WireError(
            code=ErrorCode.INVALID_PARAMS,
            message=f"'params' is larger than {limit} characters of JSON, the most a call carries.",
            details={"path": "params", "limit": limit},
        )
    return (
        budgets.call_refusal(principal, spec.name, params)
        or spec.validate(params)
        or uploads.refusal(session_id, spec.name, params)
    )


def _timeout_ms(spec: registry.CapabilitySpec, asked: int | None) -> int:
    """The job's timeout: the capability's default, or one asked within its bounds."""
    timeouts = spec.timeouts()
    if asked is None:
        return timeouts.default_ms
    if isinstance(asked, bool) or not isinstance(asked, int) or not 1 <= asked <= timeouts.max_ms:
        raise EnqueueRefused(
            WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"timeout_ms must be from 1 to {timeouts.max_ms} ms for {spec.name}.",
                details={"path": "timeout_ms", "max": timeouts.max_ms},
            )
        )
    return asked


def _user_refusal(
    spec: registry.CapabilitySpec, user_id: int | None, params: dict[str, Any]
) -> WireError | None:
    """A user who is not active, or whom the permissions or the check refuse."""
    user = load_user(user_id)
    if user is None and user_id is not None:
        return WireError(
            code=ErrorCode.PERMISSION_DENIED,
            message="The user this job would run for is not active.",
            details={"capability": spec.name},
        )
    return permissions.call_refusal(spec, user, params)


def _record_session(session_id: str, principal: AppPrincipal) -> None:
    """The job's own session row, of the app door, closed: nobody waits on it."""
    now = timezone.now()
    AgentSession.objects.create(
        id=session_id,
        door=Door.APP,
        agent_name="django",
        auth=AUTH,
        principal=principal.rate_limit_id,
        per_call=True,
        connected_at=now,
        seen_at=now,
        closed_at=now,
        close_reason=NOBODY_CONNECTED,
    )


def _bound(capability: str, job_id: str, user_id: int | None) -> QuerySet[Job]:
    """The job, only if it is this user's and this capability's (none for a bad id).

    For nobody (user_id None), only jobs Django code started for nobody: an agent's
    job for nobody (a service key's) is not Django code's to read or cancel.
    """
    try:
        pk = uuid.UUID(str(job_id))
    except ValueError:
        return Job.objects.none()
    jobs = Job.objects.filter(pk=pk, capability=capability)
    if user_id is None:
        return jobs.filter(user__isnull=True, session__door=Door.APP)
    return jobs.filter(user_id=user_id)
