"""What `@capability` returns: the function still, plus `enqueue()` for Django code.

As Django's `@task` gives a `Task` with `enqueue()`, `get_result()` and their async
twins, so a capability's name gives a `Capability`. The calls go through the port of
work/enqueueing.py; the work itself stores nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from capabilities.work import enqueueing
from capabilities.work.enqueueing import JobHandle

if TYPE_CHECKING:
    from capabilities.work.enqueueing import User

P = ParamSpec("P")
R = TypeVar("R")


class Capability(Generic[P, R]):
    """A declared capability: the function itself, and a way to start its job.

    Calling it calls the function (tests and other code do). `enqueue(params,
    user=...)` starts a job as an agent's call does, with the same checks before
    anything is stored, and returns its `JobHandle`; `get_result(job_id, user=...)`
    finds one again. The job is handed to a worker once the caller's transaction
    commits.
    """

    # The function's, copied by `functools.update_wrapper`.
    __name__: str
    __qualname__: str

    def __init__(self, function: Callable[P, R], name: str, params_adapter: Any) -> None:
        functools.update_wrapper(self, function)
        self.name = name
        self._function = function
        self._params_adapter = params_adapter

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Capability {self.name!r} {self._function.__qualname__}>"

    def enqueue(
        self, params: Any, *, user: User = None, timeout_ms: int | None = None
    ) -> JobHandle:
        """Start a job for `user` (None or AnonymousUser: for nobody); EnqueueRefused if not.

        `params`: a dict, or the hinted type (a dataclass, pydantic model...).
        `timeout_ms`: within the capability's maximum; None for its default.
        """
        return enqueueing.port().enqueue(
            self.name, self._json(params), user=user, timeout_ms=timeout_ms
        )

    async def aenqueue(
        self, params: Any, *, user: User = None, timeout_ms: int | None = None
    ) -> JobHandle:
        """`enqueue`, from async code (the checks run in the database thread)."""
        return await enqueueing.port().aenqueue(
            self.name, self._json(params), user=user, timeout_ms=timeout_ms
        )

    def get_result(self, job_id: str, *, user: User = None) -> JobHandle:
        """This capability's job `job_id` of `user`, as it is now; JobNotFound if none."""
        user_id = enqueueing.user_id_of(user)
        return enqueueing.port().find(self.name, str(job_id), user_id=user_id)

    async def aget_result(self, job_id: str, *, user: User = None) -> JobHandle:
        """`get_result`, from async code."""
        calls = enqueueing.port()
        return await calls.afind(self.name, str(job_id), user_id=enqueueing.user_id_of(user))

    def _json(self, params: Any) -> dict[str, Any]:
        if isinstance(params, Mapping):
            return dict(params)
        if self._params_adapter is None:
            raise TypeError(f"{self.name}.enqueue() takes its params as a dict.")
        data: dict[str, Any] = self._params_adapter.dump_python(params, mode="json")
        return data
