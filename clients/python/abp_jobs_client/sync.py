"""The blocking face: the asyncio client run on an event loop in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from abp_jobs_client.client import AsyncClient, CallHandle, ProgressCallback
from abp_jobs_client.messages import Result

T = TypeVar("T")


class SyncCallHandle:
    """A call in flight, from blocking code."""

    def __init__(self, client: Client, handle: CallHandle) -> None:
        self._client = client
        self._handle = handle
        self.call_id = handle.call_id

    @property
    def confirmed_in_ms(self) -> float | None:
        """How long the last cancel took to be confirmed."""
        return self._handle.confirmed_in_ms

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the Result (its typed ABPError otherwise); TimeoutError past `timeout`.

        A KeyboardInterrupt while waiting cancels the call on the server, waits for the
        confirmation, and is raised again.
        """
        return self._client.wait(self._handle.result(), timeout)

    def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """The server's confirmation `{callId, cancelled, reason?}`."""
        return self._client.run(self._handle.cancel(reason))

    def done(self) -> bool:
        """Whether the server has answered the call."""
        return self._handle.done()


class Client:
    """An ABP session for blocking code: `with Client(url, key=...) as client: ...`."""

    def __init__(self, url: str, *, key: str | None = None, **options: Any) -> None:
        """`options`: AsyncClient's (agent_name, resume_grace_seconds, retry, ...)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="abp-client", daemon=True
        )
        self._thread.start()
        self._async = self.run(_made(url, key, options))

    def __enter__(self) -> Client:
        try:
            self.run(self._async.open())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def session_id(self) -> str | None:
        """The session's id, once open."""
        return self._async.session_id

    def close(self) -> None:
        """End the session (calls in flight are cancelled), and stop the thread."""
        try:
            self.run(self._async.close(), 30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def capabilities(self) -> list[dict[str, Any]]:
        """The manifest's entries, with their schemas."""
        return self.run(self._async.capabilities())

    def call(
        self,
        capability: str,
        params: dict[str, Any],
        *,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Result:
        """Make a call and wait for its Result, retrying as the client's policy says.

        A KeyboardInterrupt while waiting cancels the call on the server, waits for the
        confirmation, and is raised again.
        """
        return self.wait(
            self._async.call(capability, params, timeout=timeout, on_progress=on_progress)
        )

    def start(
        self,
        capability: str,
        params: dict[str, Any],
        *,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
        call_id: str | None = None,
    ) -> SyncCallHandle:
        """Send a call; its handle. `on_progress` runs on the client's thread."""
        handle = self.run(
            self._async.start(
                capability, params, timeout=timeout, on_progress=on_progress, call_id=call_id
            )
        )
        return SyncCallHandle(self, handle)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the client's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def wait(self, waiting: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Wait for a call's outcome; a KeyboardInterrupt meanwhile cancels its task.

        Cancelling a task that awaits a call cancels the call on the server and waits
        for the confirmation (CallHandle.result), then the interrupt is raised again.
        """
        task = self.run(_spawned(waiting))
        try:
            return self.run(_outcome(task), timeout)
        except KeyboardInterrupt:
            self.run(_stopped(task), 30)
            raise


async def _made(url: str, key: str | None, options: dict[str, Any]) -> AsyncClient:
    # Made on the client's loop: its futures and events belong there.
    return AsyncClient(url, key=key, **options)


async def _spawned(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    return asyncio.create_task(coroutine)


async def _outcome(task: asyncio.Task[T]) -> T:
    # Shielded: the caller's interrupt cancels the call through _stopped, not here.
    return await asyncio.shield(task)


async def _stopped(task: asyncio.Task[Any]) -> None:
    # Cancelling the task cancels the call on the server and waits for the confirmation.
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
