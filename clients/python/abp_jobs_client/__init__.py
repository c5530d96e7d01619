"""A small Python client for abp-jobs over ABP (docs/python-client.md)."""

from abp_jobs_client._version import __version__
from abp_jobs_client.client import AsyncClient, CallHandle, RetryPolicy
from abp_jobs_client.errors import (
    ABPError,
    CallCancelled,
    CallTimedOut,
    Disconnected,
    InvalidParams,
    RateLimited,
    Unavailable,
    WorkerLost,
)
from abp_jobs_client.messages import Blob, Progress, Result
from abp_jobs_client.sync import Client, SyncCallHandle

__all__ = [
    "ABPError",
    "AsyncClient",
    "Blob",
    "CallCancelled",
    "CallHandle",
    "CallTimedOut",
    "Client",
    "Disconnected",
    "InvalidParams",
    "Progress",
    "RateLimited",
    "Result",
    "RetryPolicy",
    "SyncCallHandle",
    "Unavailable",
    "WorkerLost",
    "__version__",
]
