"""The operators' admin: jobs and sessions (read-only, with cancel) and agent keys."""

from capabilities.admin import jobs, keys

__all__ = ["jobs", "keys"]
