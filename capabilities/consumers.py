"""The WebSocket consumer at /abp/ws: decodes frames, performs the session's actions.

Frames and channel-layer notes are handled one at a time (Channels dispatches them
in order); timers take the same lock, so the session table never sees interleaved
updates. ORM work goes through database_sync_to_async.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from capabilities import (
    aborts,
    budgets,
    held_sessions,
    jobs,
    rate_limits,
    registry,
    replies,
    resumption,
    session_store,
    ws_auth,
)
from capabilities.consumer_access import AccessMixin
from capabilities.consumer_resume import ResumeMixin
from capabilities.jobs import CallIdInUse
from capabilities.layer import RetryingLayer
from capabilities.models import CancelSource, Job, session_group
from capabilities.protocol import ErrorCode, ProtocolError, WireError, decode
from capabilities.results import outcome_response
from capabilities.session import (
    Action,
    CancelCall,
    Close,
    Detach,
    EndCalls,
    InFlight,
    OpenSession,
    ResumeSession,
    Send,
    Session,
    StartCall,
)

logger = logging.getLogger(__name__)


def app_info() -> dict[str, str]:
    """The `app` object of initialize-result and the manifest."""
    abp = settings.ABP
    return {
        "id": abp["APP_ID"],
        "name": abp["APP_NAME"],
        "version": abp["APP_VERSION"],
        "description": abp["APP_DESCRIPTION"],
    }


def _base_url_of(scope: dict[str, Any]) -> str:
    """Where this agent reached us, for download URLs (http for ws, https for wss)."""
    host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
    if not host:
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"{server[0]}:{server[1]}"
    return f"{'https' if scope.get('scheme') == 'wss' else 'http'}://{host}"


def _capability_names() -> list[str]:
    return [spec.name for spec in registry.all_specs()]


def _timeouts(name: str) -> registry.Timeouts:
    spec = registry.get(name)
    assert spec is not None  # the session checks the name first
    return spec.timeouts()


class ABPConsumer(AccessMixin, ResumeMixin, AsyncWebsocketConsumer):  # type: ignore[misc]
    """One agent connection speaking the ABP envelope.

    Who may connect is AccessMixin's (capabilities/consumer_access.py); taking a
    session over and letting it go is ResumeMixin's (capabilities/consumer_resume.py).
    """

    # Set once a send found the socket closed, or once we closed it.
    socket_gone = False

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        """Send a frame, unless the socket is gone.

        A note (progress, a result) can arrive after the socket closed and before
        Daphne delivers the disconnect; sending then raised and killed the consumer
        before `disconnect` could cancel the session's calls. The frame is dropped
        (the outcome stays in the DB) and `disconnect` runs as it should.
        """
        if self.socket_gone:
            return
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except (Disconnected, OSError):
            # autobahn's, or the ASGI server's "closed" (abpsite/asgi.py).
            self.socket_gone = True

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        if not self.socket_gone:
            with contextlib.suppress(Disconnected):
                await super().close(code=code, reason=reason)
        self.socket_gone = True

    async def connect(self) -> None:
        self.principal: ws_auth.Principal | None = None
        self.layer = RetryingLayer(self.channel_layer)
        self.session = Session(capability_names=_capability_names, app=app_info())
        self.serial = asyncio.Lock()
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.started: dict[str, float] = {}
        self.background: set[asyncio.Future[Any]] = set()
        self.base_url = settings.ABP["PUBLIC_BASE_URL"] or _base_url_of(self.scope)
        self.group: str | None = None
        self.key_group: str | None = None
        # Bumped by each resume of the session; a note naming a newer one means
        # another connection took the session over.
        self.generation = 0
        self.superseded = False
        self.detached = False
        principal = await self.authenticate()
        if principal is None:
            return  # refused, and told why
        self.session = Session(
            capability_names=_capability_names,
            app=app_info(),
            max_concurrent_calls=principal.max_concurrent_calls,
            max_timeout_ms=lambda name: principal.max_timeout_ms(_timeouts(name).max_ms),
            # Pages do not resume (runtime.js, bridge.js): a page's session ends with its
            # socket, so its work stops at once and it holds no session place for the
            # grace period.
            resumable=principal.kind != "page" and resumption.grace().total_seconds() > 0,
        )
        await self.accept(subprotocol=ws_auth.selected_subprotocol(self.scope))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # Frames over ABP_MAX_FRAME_BYTES never get here: Daphne closes with 1009.
        if self.principal is None:
            return  # refused: the close is on its way
        frame: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        try:
            message: Any = decode(frame)
        except ProtocolError as error:
            message = error
        async with self.serial:
            await self.perform(self.session.receive(message))

    async def disconnect(self, code: int) -> None:
        if self.key_group is not None:
            await self.layer.group_discard(self.key_group, self.channel_name)
        async with self.serial:
            self.socket_gone = True
            await self.perform(self.session.disconnected(), connected=False)
            self.stop_timers()
            held_sessions.release(self.channel_name)
            if self.group is not None:
                await self.layer.group_discard(self.group, self.channel_name)
                if not (self.detached or self.superseded):
                    # Not resumable (shut down, revoked, resuming off): it ends here.
                    await database_sync_to_async(session_store.close_session)(
                        self.session.session_id, f"disconnected ({code})"
                    )
            if self.background:
                # Deliveries given back, revokes: done before the session is let go.
                await asyncio.gather(*self.background, return_exceptions=True)

    def stop_timers(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()

    # -- actions ----------------------------------------------------------------------

    async def perform(self, actions: list[Action], *, connected: bool = True) -> None:
        """Carry out the session's actions in order."""
        for action in actions:
            if isinstance(action, Send):
                await self.send(text_data=action.text)
            elif isinstance(action, OpenSession):
                if not await self.open_session(action):
                    return  # refused, and told why: the session's reply is not sent
            elif isinstance(action, ResumeSession):
                await self.resume_session(action)
            elif isinstance(action, Detach):
                await self.detach()
            elif isinstance(action, StartCall):
                await self.start_call(action)
            elif isinstance(action, CancelCall):
                await self.cancel_call(action)
            elif isinstance(action, EndCalls):
                await self.end_calls(action, connected=connected)
            elif isinstance(action, Close):
                await self.close(code=action.code)

    async def open_session(self, action: OpenSession) -> bool:
        """Record the session; False if over the principal's sessions (then closed)."""
        origin = ws_auth.origin_of(self.scope)
        assert self.principal is not None
        try:
            await database_sync_to_async(budgets.open_session)(
                self.principal,
                action.session_id,
                action.message,
                origin=origin,
                resume_token=action.resume_token,
            )
        except budgets.OverBudget as over:
            await self.send(
                text_data=replies.error_for("initialize", action.message.id, over.error)
            )
            await self.close(code=ws_auth.TOO_MANY_SESSIONS_CLOSE_CODE)
            self.principal = None  # frames already on their way are dropped
            return False
        self.group = session_group(action.session_id)
        await self.layer.group_add(self.group, self.channel_name)
        held_sessions.hold(self.channel_name, action.session_id)
        return True

    async def start_call(self, action: StartCall) -> None:
        spec = registry.get(action.capability)
        assert spec is not None  # the session checked the name
        assert self.principal is not None
        error = (
            budgets.call_refusal(self.principal, action.capability, action.params)
            or await self.over_rate_limit()
            or spec.validate(action.params)
        )
        if error is not None:
            await self.send(text_data=replies.call_error(action.request_id, action.call_id, error))
            return
        try:
            job = await self.create_job(action, spec.timeouts())
        except budgets.OverBudget as over:
            error = over.error
        except CallIdInUse:
            error = WireError(
                code=ErrorCode.INVALID_PARAMS,
                message=f"callId {action.call_id!r} was already used in this session.",
                details={"path": "payload.options.callId"},
            )
        except Exception:
            logger.exception("Could not create the job of call %s", action.call_id)
            error = WireError(
                code=ErrorCode.INTERNAL_ERROR, message="The call could not be queued; try again."
            )
        else:
            self._track(action, job)
            return
        await self.send(text_data=replies.call_error(action.request_id, action.call_id, error))

    async def over_rate_limit(self) -> WireError | None:
        """RATE_LIMITED (with retryAfter) past the principal's calls per minute."""
        assert self.principal is not None
        per_minute = self.principal.calls_per_minute
        wait_ms = await rate_limits.retry_after_ms(self.principal.rate_limit_id, per_minute)
        if wait_ms is None:
            return None
        return WireError(
            code=ErrorCode.RATE_LIMITED,
            message=f"At most {per_minute} calls per minute; retry after {wait_ms} ms.",
            retry_after_ms=wait_ms,
            details={"limit": "callsPerMinute", "max": per_minute},
        )

    async def create_job(self, action: StartCall, timeouts: registry.Timeouts) -> Job:
        """Record the call and enqueue its task (in Django's sync thread)."""
        assert self.principal is not None
        default_ms = min(timeouts.default_ms, self.principal.max_timeout_ms(timeouts.max_ms))
        job: Job = await database_sync_to_async(budgets.create_job)(
            self.principal,
            session_id=self.session.session_id,
            call_id=action.call_id,
            request_id=action.request_id,
            capability=action.capability,
            params=action.params,
            timeout_ms=action.timeout_ms or default_ms,
            progress_token=action.progress_token,
            notify_started=self.session.features.notifications,
        )
        return job

    def _track(self, action: StartCall, job: Job) -> None:
        self.session.call_started(
            call_id=action.call_id,
            request_id=action.request_id,
            job_id=str(job.id),
            progress_token=action.progress_token,
        )
        self.started[action.call_id] = time.monotonic()
        assert job.deadline is not None
        self.time_out_at(action.call_id, (job.deadline - job.created_at).total_seconds())

    def time_out_at(self, call_id: str, delay: float) -> None:
        """End the call as timed out in `delay` seconds, unless answered first."""
        self.timers[call_id] = asyncio.get_running_loop().call_later(
            max(0.0, delay), lambda: self.in_background(self.on_timeout(call_id))
        )

    async def cancel_call(self, action: CancelCall) -> None:
        if self.session.in_flight(action.call_id) is None:
            await self.adopt_unknown(action.call_id)
        call = self.session.in_flight(action.call_id)
        if call is None:
            await self.answer_cancel_of_unknown(action)
            return
        # Only the settle is awaited before the confirmation: it decides. The abort
        # flag goes up right after the two replies, off the reply path.
        won = await database_sync_to_async(jobs.settle)(
            call.job_id, jobs.Outcome.cancelled(CancelSource.AGENT, action.reason), delivered=True
        )
        if won:
            await self.send(
                text_data=replies.cancel_result(action.request_id, action.call_id, cancelled=True)
            )
            await self.answer_cancelled(call, CancelSource.AGENT)
            return
        # Settled first by the worker, a timeout or an operator: deliver that outcome.
        response = await database_sync_to_async(session_store.settled_response)(
            call.job_id, self.base_url
        )
        was_cancelled = bool(response and response.get("cancelled"))
        await self.send(
            text_data=replies.cancel_result(
                action.request_id,
                action.call_id,
                cancelled=was_cancelled,
                reason=None if was_cancelled else replies.ALREADY_COMPLETED,
            )
        )
        await self.deliver(action.call_id, response)

    async def answer_cancel_of_unknown(self, action: CancelCall) -> None:
        if self.session.session_id is None:
            return
        job = await database_sync_to_async(jobs.find_call)(self.session.session_id, action.call_id)
        if job is None:
            cancelled, reason = False, replies.NOT_FOUND
        elif job.status == "cancelled":
            cancelled, reason = True, None
        else:
            cancelled, reason = False, replies.ALREADY_COMPLETED
        await self.send(
            text_data=replies.cancel_result(
                action.request_id, action.call_id, cancelled=cancelled, reason=reason
            )
        )

    async def end_calls(self, action: EndCalls, *, connected: bool) -> None:
        if action.source == CancelSource.SHUTDOWN and self.session.session_id is not None:
            await database_sync_to_async(session_store.close_session)(
                self.session.session_id, f"shutdown: {action.reason}"
            )
        if connected:
            await self.adopt_undelivered()
        calls = self.session.in_flight_calls()
        if not calls:
            return
        source = CancelSource(action.source)
        won = await database_sync_to_async(session_store.settle_cancelled)(
            [call.job_id for call in calls], source, action.reason, delivered=connected
        )
        for call in calls:
            if won[call.job_id]:
                if connected:
                    await self.answer_cancelled(call, source)
                else:
                    self.forget(call.call_id)
                    await self.stop_work(call.job_id)
            elif connected:
                await self.deliver(call.call_id)

    async def answer_cancelled(self, call: InFlight, source: CancelSource) -> None:
        """Send the cancelled call-result of a call whose cancel this consumer won."""
        if self.session.finish(call.call_id) is None:
            return
        outcome = jobs.Outcome.cancelled(source)
        started = self.started.pop(call.call_id, time.monotonic())
        duration = int((time.monotonic() - started) * 1000)
        await self.notify_completed(call.call_id)
        await self.send(
            text_data=replies.call_result(
                call.request_id, outcome_response(call.call_id, outcome, duration)
            )
        )
        self.forget(call.call_id)
        self.gave_up_if_gone(call.job_id)
        await self.stop_work(call.job_id)

    def gave_up_if_gone(self, job_id: str) -> None:
        """A result claimed for this socket but not sent: a resume delivers it instead."""
        if self.socket_gone:
            self.in_background(database_sync_to_async(jobs.release_delivery)(job_id))

    async def stop_work(self, job_id: str) -> None:
        """After a cancel this consumer won: raise the abort flag, then revoke."""
        try:
            await aborts.request_abort_async(job_id)
        except Exception:
            # The agent has its answer; without the flag the work runs on until the
            # reaper kills it (a cancelled job whose worker has not stopped).
            logger.exception("Could not raise the abort flag of job %s", job_id)
        self.in_background(database_sync_to_async(jobs.revoke)(job_id))

    async def on_timeout(self, call_id: str) -> None:
        async with self.serial:
            call = self.session.in_flight(call_id)
            if call is None:
                return
            won = await database_sync_to_async(jobs.settle)(
                call.job_id,
                jobs.Outcome.cancelled(CancelSource.TIMEOUT, "options.timeout"),
                delivered=True,
            )
            if won:
                await self.answer_cancelled(call, CancelSource.TIMEOUT)
            else:
                await self.deliver(call_id)

    async def deliver(self, call_id: str, response: dict[str, Any] | None = None) -> None:
        """Send a settled call's result, once."""
        call = self.session.in_flight(call_id)
        if call is None:
            return  # answered already: a late note
        if self.socket_gone:
            # Claiming it now would only keep it from the connection that resumes
            # the session; unclaimed, that connection finds it.
            return
        claimed = await database_sync_to_async(session_store.claim_response)(
            call.job_id, self.base_url, response
        )
        if claimed is session_store.NotClaimed.STILL_ACTIVE:
            return  # a stale note: the job runs on
        if self.session.finish(call_id) is None:
            return
        self.forget(call_id)
        if claimed is session_store.NotClaimed.DELIVERED_ELSEWHERE:
            return  # sent by another connection holding the session for a moment
        assert isinstance(claimed, dict)
        await self.notify_completed(call_id)
        await self.send(text_data=replies.call_result(call.request_id, claimed))
        self.gave_up_if_gone(call.job_id)

    def in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run bookkeeping that no reply waits for; keep a reference until it ends."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def forget(self, call_id: str) -> None:
        timer = self.timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()
        self.started.pop(call_id, None)

    async def notify_completed(self, call_id: str) -> None:
        if self.session.features.notifications:
            await self.send(
                text_data=replies.notification(
                    "notifications/operation/completed", {"operationId": call_id}
                )
            )

    # -- notes from workers, the reaper and the admin (channel layer) -------------------

    async def job_started(self, event: dict[str, Any]) -> None:
        if self.session.features.notifications and self.session.in_flight(event["call_id"]):
            await self.send(
                text_data=replies.notification(
                    "notifications/operation/started", {"operationId": event["call_id"]}
                )
            )

    async def job_progress(self, event: dict[str, Any]) -> None:
        call = self.session.in_flight(event["call_id"])
        if call is None or call.progress_token is None:
            return
        await self.send(
            text_data=replies.progress(
                call.progress_token,
                progress=event["progress"],
                total=event["total"],
                stage=event["stage"],
            )
        )

    async def job_settled(self, event: dict[str, Any]) -> None:
        async with self.serial:
            call_id = event["call_id"]
            if self.session.in_flight(call_id) is None and not await self.adopt_unknown(call_id):
                return  # answered already (a late note), or not this connection's
            await self.deliver(call_id, event.get("response"))
