"""Testing a capability: in this process (`in_process`), or through the real stack (`live`).

`run_capability` runs one in this thread with a recording context; `LiveStack` starts
Redis, a Celery worker, beat and Daphne for the host project, and the pytest plugin
(`pytest_plugins = ["capabilities.testing.pytest_plugin"]`) hands one to tests as
`abp_stack` (docs/your-capabilities.md#testing-it).
"""

from capabilities.testing.in_process import (
    CapabilityRun,
    Progress,
    RecordingContext,
    run_capability,
)

__all__ = ["CapabilityRun", "Progress", "RecordingContext", "run_capability"]
