"""App config."""

import logging

from django.apps import AppConfig
from django.core import checks

from capabilities.checks import (
    built_ins_switched_off,
    development_password_in_use,
    local_lane_time_limit,
)
from capabilities.conf import abp_settings

logger = logging.getLogger("capabilities")


class CapabilitiesConfig(AppConfig):
    """The ABP engine: protocol, sessions, jobs, capabilities."""

    name = "capabilities"
    verbose_name = "ABP capabilities"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from capabilities import conf, log_filters
        from capabilities.calls import app_calls
        from capabilities.work import enqueueing, registry

        conf.install()
        # After Django's LOGGING is applied: it runs before any app is ready.
        log_filters.install()
        # Every installed app's `abp_capabilities` module (docs/your-capabilities.md).
        registry.autodiscover()
        # `capability.enqueue()` stores jobs through the call service (dependency
        # inversion: the work imports nothing of it).
        enqueueing.install(app_calls.AppCalls())
        checks.register(development_password_in_use, checks.Tags.security)
        checks.register(local_lane_time_limit)
        checks.register(built_ins_switched_off)
        from capabilities.endings import user_deactivation

        # A user deactivated or deleted: their sessions close on every door.
        user_deactivation.connect_signals()
        if abp_settings().ALLOW_ANONYMOUS:
            # Production refuses this setting; in development, say it loudly.
            logger.warning(
                "ABP_ALLOW_ANONYMOUS is on: WebSocket clients without an agent key are "
                "let in. Development only."
            )
