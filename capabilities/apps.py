"""App config."""

from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    """The ABP engine: protocol, sessions, jobs, capabilities."""

    name = "capabilities"
    verbose_name = "ABP capabilities"
    default_auto_field = "django.db.models.BigAutoField"
