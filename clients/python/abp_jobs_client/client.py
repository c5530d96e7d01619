"""The asyncio client: one ABP session over one WebSocket, resumed when the socket drops."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from abp_jobs_client import messages, transfers
from abp_jobs_client._version import __version__
from abp_jobs_client.errors import ABPError, Disconnected, InvalidParams
from abp_jobs_client.messages import Blob, Progress, Result

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[Progress], None]
# Results up to the server's inline limit (10 MiB of bytes, as base64) fit in one frame.
MAX_FRAME_BYTES = 64 * 1024 * 1024
# Closes after which the session is taken back: the network dropped (1006, no close
# frame), or the server went away or restarts. Others end it for this client: a
# shutdown (1000), a frame over the server's limit (1009: its frame is gone, and
# resuming would leave that call unanswered), a revoked key, a takeover (4409).
RESUMABLE_CLOSE_CODES = frozenset({None, 1001, 1006, 1011, 1012, 1013, 1014})
# The server's refusals of a connection's credential or budget (docs/protocol.md).
REFUSED_CLOSE_CODES = {
    4401: "PERMISSION_DENIED",
    4403: "PERMISSION_DENIED",
    4419: "PERMISSION_DENIED",
    4429: "RATE_LIMITED",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Calls answered with a retryable error (WORKER_LOST included) are made again."""

    attempts: int = 3
    backoff_seconds: float = 0.5

    def delay(self, attempt: int, error: ABPError) -> float:
        """Seconds before attempt `attempt + 1`: the server's retryAfter, or a backoff."""
        if error.retry_after_ms is not None:
            return error.retry_after_ms / 1000
        return float(self.backoff_seconds * 2 ** (attempt - 1))


class CallHandle:
    """A call in flight: await it for its Result, or cancel it."""

    def __init__(
        self, client: AsyncClient, call_id: str, frame_id: str, payload: dict[str, Any]
    ) -> None:
        self.call_id = call_id
        self.frame_id = frame_id
        self.payload = payload
        """The call as sent: sent again after a resume if the server never got it."""
        self.sent = False
        self._client = client
        self._answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.confirmed_in_ms: float | None = None

    def __await__(self) -> Generator[Any, None, Result]:
        return self.result().__await__()

    async def result(self) -> Result:
        """The call's Result; its typed ABPError otherwise.

        Cancelling the task awaiting this cancels the call on the server, and waits
        for the server's confirmation, before the task ends cancelled.
        """
        try:
            payload = await asyncio.shield(self._answer)
        except asyncio.CancelledError:
            if not self._answer.done():
                with contextlib.suppress(ABPError):
                    await asyncio.shield(self.cancel("the awaiting task was cancelled"))
            raise
        if payload.get("success"):
            data = await self._client.with_blobs(payload.get("data") or {})
            metadata = payload.get("metadata") or {}
            return Result(self.call_id, data, metadata.get("duration"), metadata)
        raise ABPError.from_wire(payload.get("error") or {"code": "INTERNAL_ERROR"})

    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Ask the server to cancel; its confirmation `{callId, cancelled, reason?}`."""
        payload: dict[str, Any] = {"callId": self.call_id}
        if reason:
            payload["reason"] = reason
        started = time.perf_counter()
        confirmation = await self._client.request("capabilities/cancel", payload)
        self.confirmed_in_ms = (time.perf_counter() - started) * 1000
        return confirmation

    def done(self) -> bool:
        """Whether the server has answered the call."""
        return self._answer.done()

    def settle(self, payload: dict[str, Any]) -> bool:
        """The call's answer arrived; False if it had one already (sent once)."""
        if self._answer.done():
            return False
        self._answer.set_result(payload)
        return True


class AsyncClient:
    """An ABP session: `async with AsyncClient(url, key=...) as client: ...`."""

    def __init__(
        self,
        url: str,
        *,
        key: str | None = None,
        agent_name: str = "abp-jobs-client",
        agent_version: str = __version__,
        resume_grace_seconds: float = 60.0,
        retry: RetryPolicy | None = None,
        max_frame_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.max_frame_bytes = max_frame_bytes
        self.key = key
        self.session_id: str | None = None
        self.capability_names: list[str] = []
        self._agent = (agent_name, agent_version)
        self._grace = resume_grace_seconds
        self._retry = retry
        self._ids = itertools.count(1)
        self._ws: ClientConnection | None = None
        self._token: str | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._reader: asyncio.Task[None] | None = None
        self._requests: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._calls: dict[str, CallHandle] = {}
        self._progress: dict[str, ProgressCallback] = {}
        self._lost: ABPError | None = None

    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect and initialize a new session (ABPError if that fails)."""
        try:
            await self._connect(resume=False)
        except (OSError, InvalidStatus, ConnectionClosed, TimeoutError) as failed:
            raise ABPError(
                "TRANSPORT_ERROR", f"Could not connect: {failed}", retryable=True
            ) from None
        self._reader = asyncio.create_task(self._read_forever())

    async def close(self) -> None:
        """End the session for good: calls still in flight are cancelled by the server."""
        self._closing = True
        ws = self._ws
        if ws is not None and self._connected.is_set():
            with contextlib.suppress(ConnectionClosed, OSError):
                await ws.send(messages.envelope("shutdown", self._next_id(), {}))
                await asyncio.wait_for(ws.wait_closed(), timeout=10)
            await ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_all(Disconnected("DISCONNECTED", "The client closed the session."))

    async def capabilities(self) -> list[dict[str, Any]]:
        """The manifest's entries: name, description, schemas, and whether available now."""
        payload = await self.request("capabilities/list", {})
        listed: list[dict[str, Any]] = payload.get("capabilities", [])
        return listed

    async def call(
        self,
        capability: str,
        params: dict[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the server's limit on the call
        on_progress: ProgressCallback | None = None,
        call_id: str | None = None,
    ) -> Result:
        """Make a call and wait for its Result (retrying retryable errors if told to)."""
        attempt = 1
        while True:
            handle = await self.start(
                capability, params, timeout=timeout, on_progress=on_progress, call_id=call_id
            )
            try:
                return await handle
            except ABPError as error:
                if self._retry is None or not error.retryable or attempt >= self._retry.attempts:
                    raise
                delay = self._retry.delay(attempt, error)
                logger.info(
                    "Call %s: %s; attempt %d in %.2f s",
                    handle.call_id,
                    error.code,
                    attempt + 1,
                    delay,
                )
                await asyncio.sleep(delay)
                attempt += 1
                call_id = None  # a new call: the old id is answered already

    async def start(
        self,
        capability: str,
        params: dict[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the server's limit on the call
        on_progress: ProgressCallback | None = None,
        call_id: str | None = None,
    ) -> CallHandle:
        """Send a call; its handle, to await or cancel. `timeout` in seconds (server-side)."""
        call_id = call_id or uuid.uuid4().hex
        sendable = await self._sendable(params)
        timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
        frame_id = self._next_id()
        payload = messages.call(capability, sendable, call_id, timeout_ms)
        frame = messages.envelope("capabilities/call", frame_id, payload)
        if len(frame.encode()) > self.max_frame_bytes:
            raise InvalidParams(
                "INVALID_PARAMS",
                f"The call is {len(frame.encode())} bytes as a frame; the server takes at most "
                f"{self.max_frame_bytes} (send big binary inputs as bytes: they are uploaded).",
                details={"path": "params", "limit": self.max_frame_bytes},
            )
        handle = CallHandle(self, call_id, frame_id, payload)
        self._calls[call_id] = handle
        if on_progress is not None:
            self._progress[call_id] = on_progress
        await self._send_frame(frame)
        handle.sent = True
        return handle

    async def request(self, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Send a request and wait for its reply's payload (an error reply raises)."""
        id_ = self._next_id()
        answer = asyncio.get_running_loop().create_future()
        self._requests[id_] = answer
        try:
            await self._send(type_, id_, payload)
            reply: dict[str, Any] = await answer
        finally:
            self._requests.pop(id_, None)
        if isinstance(reply.get("error"), dict):
            raise ABPError.from_wire(reply["error"])
        return reply

    async def with_blobs(self, data: dict[str, Any]) -> dict[str, Any]:
        """The data with binary values as Blobs, download links fetched."""
        urls = {
            ref["downloadUrl"] for ref in messages.binary_references(data) if "downloadUrl" in ref
        }
        fetched = {url: await asyncio.to_thread(transfers.download, url) for url in urls}
        converted: dict[str, Any] = messages.with_blobs(data, fetched)
        return converted

    # -- the socket ---------------------------------------------------------------------

    async def _connect(self, *, resume: bool) -> None:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        ws = await connect(self.url, additional_headers=headers, max_size=MAX_FRAME_BYTES)
        resumed = (
            (self.session_id, self._token) if resume and self.session_id and self._token else None
        )
        # Calls sent on a socket that dropped; those not sent yet go out once connected.
        awaiting = [handle for handle in self._calls.values() if handle.sent]
        hello = messages.initialize(
            *self._agent, resumed, [handle.call_id for handle in awaiting] if resumed else None
        )
        try:
            await ws.send(messages.envelope("initialize", self._next_id(), hello))
            reply = json.loads(await ws.recv())
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            if code in REFUSED_CLOSE_CODES:
                reason = closed.rcvd.reason if closed.rcvd is not None else ""
                message = reason or f"The server refused the connection ({code})."
                raise ABPError(REFUSED_CLOSE_CODES[code], message, retryable=code == 4429) from None
            raise
        payload = reply.get("payload") or {}
        if reply.get("type") != "initialize-result" or "error" in payload:
            await ws.close()
            raise ABPError.from_wire(payload.get("error") or {"code": "SESSION_INVALID"})
        self.session_id = payload["sessionId"]
        self._token = payload.get("resumeToken")
        self.capability_names = [entry["name"] for entry in payload.get("capabilities", [])]
        held = payload.get("heldCalls")
        if resumed and isinstance(held, list):
            lost = [handle for handle in awaiting if handle.call_id not in held]
            await self._send_again(lost, ws)
        self._ws = ws
        self._connected.set()

    async def _send_again(self, lost: list[CallHandle], ws: ClientConnection) -> None:
        """Send the calls whose frames the server never got, before anything newer."""
        for handle in lost:
            if not handle.done():
                logger.info("Call %s never reached the server; sending it again", handle.call_id)
                frame = messages.envelope(
                    "capabilities/call", handle.frame_id, messages.resent(handle.payload)
                )
                await ws.send(frame)

    async def _read_forever(self) -> None:
        while True:
            ws = self._ws
            assert ws is not None
            try:
                async for frame in ws:
                    self._received(json.loads(frame))
            except ConnectionClosed:
                pass
            self._connected.clear()
            if self._closing:
                return
            if ws.close_code not in RESUMABLE_CLOSE_CODES:
                reason = f"The server closed the connection ({ws.close_code} {ws.close_reason})."
                self._fail_all(Disconnected("DISCONNECTED", reason.replace(" )", ")")))
                return
            if not await self._resume():
                return

    async def _resume(self) -> bool:
        """Take the session back on a new socket, until the grace period is over."""
        give_up_at = time.monotonic() + self._grace
        delay = 0.1
        for request in self._requests.values():  # their replies went with the socket
            if not request.done():
                request.set_exception(Disconnected("DISCONNECTED", "The connection dropped."))
        while time.monotonic() < give_up_at and not self._closing:
            try:
                await self._connect(resume=True)
                logger.info("Resumed session %s", self.session_id)
                return True
            except ABPError as refused:
                self._fail_all(Disconnected("DISCONNECTED", f"Could not resume: {refused}"))
                return False
            except (OSError, ConnectionClosed, InvalidStatus, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        self._fail_all(Disconnected("DISCONNECTED", "The connection could not be resumed in time."))
        return False

    def _received(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        payload = message.get("payload") or {}
        if kind == "capabilities/call-result":
            # Answered calls are forgotten: a second copy (after a resume) finds none.
            handle = self._calls.pop(str(payload.get("callId")), None)
            if handle is not None and handle.settle(payload):
                self._progress.pop(handle.call_id, None)
            return
        if kind == "progress":
            token = str(payload.get("operationId"))
            callback = self._progress.get(token)
            if callback is not None:
                callback(Progress.from_wire(token, payload))
            return
        request = self._requests.get(str(message.get("id")))
        if request is not None and not request.done():
            request.set_result(payload)

    async def _send(self, type_: str, id_: str, payload: dict[str, Any]) -> None:
        await self._send_frame(messages.envelope(type_, id_, payload))

    async def _send_frame(self, frame: str) -> None:
        while True:
            if self._lost is not None:
                raise self._lost
            await self._connected.wait()
            ws = self._ws
            assert ws is not None
            try:
                await ws.send(frame)
                return
            except ConnectionClosed:
                self._connected.clear()  # the reader resumes; send again after

    def _fail_all(self, error: ABPError) -> None:
        self._lost = error
        self._connected.set()  # wake senders, which then raise
        for handle in self._calls.values():
            handle.settle({"success": False, "error": _wire(error)})
        self._calls.clear()
        self._progress.clear()
        for request in self._requests.values():
            if not request.done():
                request.set_exception(error)

    async def _sendable(self, params: dict[str, Any]) -> dict[str, Any]:
        """Params with bytes and Blobs as inline base64, or uploads when they are big."""
        converted: dict[str, Any] = {}
        for name, value in params.items():
            blob = Blob(bytes(value)) if isinstance(value, bytes | bytearray) else value
            if isinstance(blob, Blob):
                converted[name] = await self._binary_input(blob)
            else:
                converted[name] = value
        return converted

    async def _binary_input(self, blob: Blob) -> dict[str, Any]:
        if len(blob.content) < messages.UPLOAD_FROM_BYTES or self.session_id is None:
            return blob.inline()
        url = transfers.uploads_url(self.url)
        return await asyncio.to_thread(transfers.upload, url, self.key, self.session_id, blob)

    def _next_id(self) -> str:
        return str(next(self._ids))


def _wire(error: ABPError) -> dict[str, Any]:
    return {"code": error.code, "message": error.message, "retryable": error.retryable}
