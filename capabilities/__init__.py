"""ABP capabilities as cancellable Celery jobs.

The public API, for a project's own capabilities (docs/your-capabilities.md)::

    from capabilities import CapabilityError, File, JobAborted, JobContext, capability

and for Django code starting a capability's job (`squares.enqueue(params, user=...)`)::

    from capabilities import EnqueueRefused, JobHandle, JobNotFound

Loaded lazily: this is also the Django app's package, which must import nothing
(no models, no settings) until the app registry asks.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# The one place the version is written: pyproject.toml reads it, and so does the
# manifest's default APP_VERSION.
__version__ = "0.2.0"

if TYPE_CHECKING:
    from capabilities.work.context import CapabilityError, File, JobAborted, JobContext
    from capabilities.work.declare import capability
    from capabilities.work.enqueueing import EnqueueRefused, JobHandle, JobNotFound

__all__ = [
    "CapabilityError",
    "EnqueueRefused",
    "File",
    "JobAborted",
    "JobContext",
    "JobHandle",
    "JobNotFound",
    "capability",
]

_WHERE = {
    "CapabilityError": "capabilities.work.context",
    "File": "capabilities.work.context",
    "JobAborted": "capabilities.work.context",
    "JobContext": "capabilities.work.context",
    "capability": "capabilities.work.declare",
    "EnqueueRefused": "capabilities.work.enqueueing",
    "JobHandle": "capabilities.work.enqueueing",
    "JobNotFound": "capabilities.work.enqueueing",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'capabilities' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
