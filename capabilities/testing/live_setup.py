"""Run by `LiveStack` in the host's interpreter, on the stack's settings, before the rest.

`python -m capabilities.testing.live_setup NAME`: migrates the stack's database,
creates an agent key for NAME, and prints one line of JSON with what the stack needs
of the host's settings: the key, the queues a worker must consume (every capability's,
and the app's own for beat's housekeeping) and the frame limit Daphne enforces.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from capabilities.conf import abp_settings


def prepare(name: str) -> dict[str, Any]:
    """Migrate, create the key, and say what the stack's processes need."""
    import django

    django.setup()
    from django.core.management import call_command

    from capabilities.access.agent_keys import create_key
    from capabilities.jobs.queue import queue_for
    from capabilities.work import registry

    call_command("migrate", interactive=False, verbosity=0)
    _, key = create_key(name)
    abp = abp_settings()
    queues = {*abp.QUEUES.names(), *(queue_for(spec.name) for spec in registry.all_specs())}
    return {"key": key, "queues": sorted(queues), "maxFrameBytes": abp.MAX_FRAME_BYTES}


if __name__ == "__main__":
    print(json.dumps(prepare(sys.argv[1])))
