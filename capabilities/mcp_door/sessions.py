"""An MCP session's row: its jobs belong to a session, as an ABP connection's do.

A stateful MCP session (the 2025 handshake) gets one `AgentSession` (door MCP), with
the MCP session id as its id, written when it initializes (`admit_at_initialize`, a
server middleware), where a principal with no room for another session is refused.
It ends with the MCP session (DELETE, the idle timeout, shutdown): its calls still
running are then cancelled with source disconnect. While it lives, this Daphne keeps
it seen, so the reaper leaves it alone. A row ended meanwhile to make room for
another session of its key (or expired) is opened again, room permitting, by the
session's next tool call: its tasks are found by the row's id, which stays.

A session-less request (2026-07-28) gets a row of its own for its one call, marked
`per_call`: the call counts as a call in flight, never as an open session. This
Daphne keeps the row seen while the call runs. The row is written to the end even
if the request is cancelled meanwhile, and then closed: a cancel leaves none open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from channels.db import database_sync_to_async
from django.db import DatabaseError
from django.utils import timezone
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.shared.exceptions import MCPError

from capabilities.access.principal import Principal
from capabilities.calls import budgets, held_sessions, session_records, start
from capabilities.endings import background, cancellation, resumption
from capabilities.jsonrpc.error_codes import jsonrpc_error
from capabilities.mcp_door import call_watch, sdk_seams
from capabilities.models import AgentSession, CancelSource, Door

logger = logging.getLogger(__name__)

ENDED_REASON = "MCP session ended"
# Rows of a live MCP session closed by someone else: its next tool call opens them again.
REOPENED_REASONS = (budgets.MADE_ROOM_REASON, resumption.EXPIRED_REASON)
_open: set[str] = set()
# Sessions a client is deleting: their calls cut short are disconnects, not cancels.
_ending: set[str] = set()


@dataclass(frozen=True, kw_only=True)
class _Opener:
    """What a session's row records of the request that opened it."""

    agent: tuple[str, str]
    protocol_version: str
    origin: str

    @classmethod
    def of(cls, ctx: ServerRequestContext[Any, Any], protocol_version: str = "") -> _Opener:
        params = ctx.session.client_params
        if params is not None:
            agent = (params.client_info.name, params.client_info.version)
        else:  # `initialize` itself: the SDK commits the client's params after it
            info = (ctx.params or {}).get("clientInfo")
            info = info if isinstance(info, dict) else {}
            agent = (str(info.get("name", "")), str(info.get("version", "")))
        headers = getattr(ctx.request, "headers", {}) or {}
        return cls(
            agent=agent,
            protocol_version=protocol_version or ctx.protocol_version or "",
            origin=str(headers.get("origin", "")),
        )


async def session_for(
    ctx: ServerRequestContext[Any, Any], principal: Principal
) -> tuple[str, bool]:
    """The session row of this request's MCP session, and whether it is this call's own.

    OverBudget (RATE_LIMITED) if the principal has its most sessions open and none
    of them can be ended to make room (a stateful session's row ended meanwhile).
    """
    connection = sdk_seams.connection_of(ctx)
    session_id = session_id_of(ctx)
    with _refused_while_unwritable():
        if session_id is None or connection is None:
            return await _per_call_session(_Opener.of(ctx), principal), True
        await _stateful_session(session_id, connection, _Opener.of(ctx), principal)
    return session_id, False


async def session_for_call(
    ctx: ServerRequestContext[Any, Any], principal: Principal
) -> tuple[str, bool, Callable[[], None] | None]:
    """`session_for` for a tool call: a stateful session's row is checked in the call's own hop.

    The third value, if any, is the check (`start.CallRequest.check`): the row is
    open, or opened again, in the database hop that writes the call's row, so the call
    makes one hop instead of two. The session is held from now on.
    """
    connection = sdk_seams.connection_of(ctx)
    session_id = session_id_of(ctx)
    if session_id is None or connection is None:
        with _refused_while_unwritable():
            return await _per_call_session(_Opener.of(ctx), principal), True, None
    _hold(session_id, connection)
    # What opened it is read only if its row must be written again (rarely).
    opener = functools.partial(_Opener.of, ctx)
    check = functools.partial(_ensure_open, session_id, opener, principal)
    return session_id, False, check


@contextlib.contextmanager
def _refused_while_unwritable() -> Iterator[None]:
    """A call whose session row cannot be written (PostgreSQL away) is refused, retryable:
    nothing was started (a bare "Internal server error" otherwise)."""
    try:
        yield
    except DatabaseError:
        logger.warning("MCP call refused: its session row could not be written now")
        raise start.CallRefused(start.NOT_QUEUED) from None


def admit_at_initialize(
    principal_of: Callable[[ServerRequestContext[Any, Any]], Principal],
) -> ServerMiddleware[Any]:
    """A server middleware writing a stateful session's row when it initializes.

    A principal with no room for another session is refused there: a JSON-RPC error
    whose data is the ABP error (RATE_LIMITED, `details: {limit: "openSessions", max}`).
    """

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        connection = sdk_seams.connection_of(ctx)
        session_id = session_id_of(ctx)
        if ctx.method != "initialize" or connection is None or session_id is None:
            return result
        agreed = result.get("protocolVersion") if isinstance(result, dict) else None
        opener = _Opener.of(ctx, str(agreed or ""))
        try:
            await _stateful_session(session_id, connection, opener, principal_of(ctx))
        except budgets.OverBudget as over:
            code, _ = jsonrpc_error(over.error.code)
            raise MCPError(code, over.error.message, data=over.error.to_json()) from None
        return result

    return middleware


def session_id_of(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The session row id of this request's MCP session; None without one (2026-07-28)."""
    connection = sdk_seams.connection_of(ctx)
    if connection is None or connection.session_id is None:
        return None
    return str(uuid.UUID(hex=connection.session_id))


def mark_ending(mcp_session_id: str) -> None:
    """A DELETE for this MCP session arrived (before the SDK ends it).

    Only a session open here is marked: one this process does not serve (another
    Daphne's, one gone) is never ended here, and would stay in the set for good.
    """
    try:
        session_id = str(uuid.UUID(hex=mcp_session_id))
    except ValueError:
        return
    if session_id in _open:
        _ending.add(session_id)


def is_ending(session_id: str) -> bool:
    """Whether the session's client is ending it (DELETE)."""
    return session_id in _ending


async def end_session(session_id: str) -> None:
    """The MCP session (or a per-call row's call) is over: cancel what runs, record the end."""
    _open.discard(session_id)
    _ending.discard(session_id)
    held_sessions.release(_holder(session_id))
    try:
        await database_sync_to_async(_end)(session_id)
    except DatabaseError:
        # PostgreSQL away: the row, held by nobody now, is the reaper's to end; what
        # the session answered stands.
        logger.warning("MCP session %s not ended yet: left to the reaper", session_id)


async def let_go(session_id: str, reason: str) -> None:
    """A per-call row whose call outlives its request (a task): closed, its call left running.

    Not held any more, and closed, so the reaper never looks at it; the task is found
    by its owner, not by this row.
    """
    held_sessions.release(_holder(session_id))
    await database_sync_to_async(session_records.close_session)(session_id, reason)


async def _per_call_session(opener: _Opener, principal: Principal) -> str:
    session_id = str(uuid.uuid4())
    # Seen while its call runs: the reaper ends rows nobody holds.
    held_sessions.hold(_holder(session_id), session_id)
    writing = background.unstoppable(
        database_sync_to_async(_write_per_call)(session_id, opener, principal)
    )
    try:
        await background.waited(writing)
        # A cancel held back while the row was written lands here.
        await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        # Cancelled while the insert goes on in its thread (or it failed): once it is
        # done, nothing of it stays open.
        await background.waited(background.unstoppable(_end_after(writing, session_id)))
        raise
    return session_id


async def _end_after(writing: asyncio.Future[None], session_id: str) -> None:
    await asyncio.wait([writing])
    await end_session(session_id)


async def _stateful_session(
    session_id: str, connection: Connection, opener: _Opener, principal: Principal
) -> None:
    """The session's row, open (written, or opened again); held while the MCP session lives."""
    writing = background.unstoppable(
        database_sync_to_async(_ensure_open)(session_id, lambda: opener, principal)
    )
    try:
        await background.waited(writing)
    except budgets.OverBudget:
        raise
    except BaseException:
        # Cancelled: the row may still be written, and it is this session's.
        _hold(session_id, connection)
        raise
    _hold(session_id, connection)


def _hold(session_id: str, connection: Connection) -> None:
    if session_id in _open:
        return
    _open.add(session_id)
    held_sessions.hold(_holder(session_id), session_id)
    connection.exit_stack.push_async_callback(end_session, session_id)
    # Closed when its access is withdrawn (a key revoked, a user deactivated).
    connection.exit_stack.callback(call_watch.close_when_withdrawn(session_id, connection).cancel)


def _holder(session_id: str) -> str:
    return f"mcp:{session_id}"


def _ensure_open(session_id: str, opener: Callable[[], _Opener], principal: Principal) -> None:
    rows = AgentSession.objects.filter(pk=session_id).values("closed_at", "close_reason")[:1]
    row = next(iter(rows), None)
    if row is None:
        budgets.make_room_for_session(principal)
        _record(session_id, opener(), principal)
    elif row["closed_at"] is not None and row["close_reason"] in REOPENED_REASONS:
        budgets.make_room_for_session(principal)
        AgentSession.objects.filter(pk=session_id, closed_at__isnull=False).update(
            closed_at=None, close_reason="", seen_at=timezone.now()
        )
        logger.info("MCP session %s was opened again", session_id)


def _write_per_call(session_id: str, opener: _Opener, principal: Principal) -> None:
    _record(session_id, opener, principal, per_call=True)


def _record(
    session_id: str, opener: _Opener, principal: Principal, *, per_call: bool = False
) -> None:
    session_records.record_session(
        session_id,
        principal,
        door=Door.MCP,
        agent=opener.agent,
        protocol_version=opener.protocol_version,
        origin=opener.origin,
        per_call=per_call,
    )


def _end(session_id: str) -> None:
    session_records.close_session(session_id, ENDED_REASON)
    cancellation.cancel_session_calls(
        session_id, source=CancelSource.DISCONNECT, reason=ENDED_REASON
    )
    logger.info("MCP session %s ended", session_id)
