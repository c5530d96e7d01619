"""What a host's Celery app needs from this app: its tasks, their queues, beat's schedule.

One line in the host's `celery.py`, after `config_from_object`: `configure(app)`.

Daphne and the admin send and revoke tasks by name (capabilities/jobs/queue.py), so
only a worker imports them, and with them WeasyPrint and Pillow. A job goes to its
capability's queue, `ABP["QUEUES"]` (`abp.small`, `abp.heavy`) unless
`ABP["CAPABILITY_QUEUES"]` moves it; beat's housekeeping goes to the small queue. The
host runs a worker per queue and one beat (docs/operating.md#a-project-of-your-own).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from capabilities import conf

# The worker's tasks: abp.run_job, abp.reap, abp.clean_up.
TASKS_MODULE = "capabilities.worker.tasks"
CLEAN_UP_INTERVAL_SECONDS = 3600.0


def configure(app: Celery) -> None:
    """Point the host's Celery app at the app's tasks, queues and schedule."""
    # The app sends through `current_app`, which in any thread but the one that made
    # the host's app is Celery's fallback app, on no broker of the host's.
    app.set_default()
    if app.configured:  # type: ignore[attr-defined]  # not in celery-types
        _add_tasks_and_schedule(app.conf)
    else:
        app.on_after_configure.connect(_on_configured, sender=app, weak=False)


def schedule() -> dict[str, dict[str, Any]]:
    """Beat's entries: the reaper every REAPER_INTERVAL_SECONDS, the hourly clean-up."""
    abp = conf.abp_settings()
    small = {"queue": abp.QUEUES.small}
    return {
        "abp-reap": {
            "task": "abp.reap",
            "schedule": abp.REAPER_INTERVAL_SECONDS,
            "options": small,
        },
        "abp-clean-up": {
            "task": "abp.clean_up",
            "schedule": CLEAN_UP_INTERVAL_SECONDS,
            "options": small,
        },
    }


def _on_configured(sender: Celery, source: Any, **_: Any) -> None:
    _add_tasks_and_schedule(source)


def _add_tasks_and_schedule(config: Any) -> None:
    # The host's own imports and entries stay; its entry of the same name wins.
    imports = tuple(config.get("imports") or ())
    config.update(
        imports=imports if TASKS_MODULE in imports else (*imports, TASKS_MODULE),
        beat_schedule={**schedule(), **(config.get("beat_schedule") or {})},
    )
