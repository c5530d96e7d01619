"""The app's settings, typed: `abp_settings().MAX_TIMEOUT_MS`.

A host project sets only what it changes (`ABP = {"MAX_TIMEOUT_MS": 600_000}`); the
rest is the default of `capabilities/config/schema.py`. Each namespace (`ABP`,
`ABP_METRICS`, `ABP_STORAGE`) is validated at start (`install`, from the app's
`ready`), so a bad value stops the process with an error naming its key, and built
again after a test overrides it. Code reads the frozen models' fields, never the dicts.

The other settings the app reads get a default when the host has none: `REDIS_URL`,
`CHANNEL_LAYERS` (this app's Redis pub/sub layer on `REDIS_URL`), `DEVELOPMENT` and the
development superuser's name and password (which a system check looks for).
docs/operating.md#a-project-of-your-own lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from pydantic import BaseModel, ValidationError

from capabilities.config.errors import Location, described
from capabilities.config.schema import AbpSettings, MetricsSettings, StorageSettings

# The namespaced settings, each a model of its keys and defaults.
NAMESPACES: dict[str, type[BaseModel]] = {
    "ABP": AbpSettings,
    "ABP_METRICS": MetricsSettings,
    "ABP_STORAGE": StorageSettings,
}

# Plain settings the app reads, set only when the host has none.
# One Redis carries the Celery broker (the host's own setting), the channel layer and
# the abort flags.
PLAIN_DEFAULTS: dict[str, Any] = {
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    # Production unless the host says otherwise: no system check is relaxed.
    "DEVELOPMENT": False,
    # `manage.py ensure_dev_superuser` creates this account (DEBUG only), and a system
    # check refuses it in production with its password unchanged.
    "DEV_SUPERUSER_USERNAME": "admin",
    "DEV_SUPERUSER_PASSWORD": "admin",
}

CHANNEL_LAYER_BACKEND = "capabilities.channel_layer.RetryingPubSubChannelLayer"


def abp_settings() -> AbpSettings:
    """`settings.ABP`, typed: the host's keys over the defaults."""
    return _read("ABP", AbpSettings)


def metrics_settings() -> MetricsSettings:
    """`settings.ABP_METRICS`, typed."""
    return _read("ABP_METRICS", MetricsSettings)


def storage_settings() -> StorageSettings:
    """`settings.ABP_STORAGE`, typed."""
    return _read("ABP_STORAGE", StorageSettings)


# Each namespace's model, built at the first read after start or a change.
_built: dict[str, Any] = {}
Model = TypeVar("Model", bound=BaseModel)


def _read(name: str, model: type[Model]) -> Model:
    found = _built.get(name)
    return found if isinstance(found, model) else _build(name, model)


def _build(name: str, model: type[Model]) -> Model:
    """Validate `settings.<name>`; ImproperlyConfigured naming each bad key."""
    given = getattr(settings, name, None) or {}
    if not isinstance(given, Mapping):
        raise ImproperlyConfigured(f"settings.{name} must be a dict, not {type(given).__name__}.")
    try:
        built = model.model_validate(dict(given))
    except ValidationError as error:
        raise ImproperlyConfigured(described(error, _key_of(name))) from None
    _built[name] = built
    return built


def _key_of(name: str) -> Callable[[Location], str]:
    def key(location: Location) -> str:
        return f"settings.{name}" + "".join(f"[{part!r}]" for part in location)

    return key


def channel_layers(redis_url: str) -> dict[str, Any]:
    """The channel layer the app needs when the host has none: pub/sub on `redis_url`."""
    return {"default": {"BACKEND": CHANNEL_LAYER_BACKEND, "CONFIG": {"hosts": [redis_url]}}}


def install() -> None:
    """Validate every namespace (at app start: a bad key stops the process), and give
    the plain settings their defaults."""
    _built.clear()
    for name, model in NAMESPACES.items():
        _build(name, model)
    for name, value in PLAIN_DEFAULTS.items():
        if not hasattr(settings, name):
            setattr(settings, name, value)
    if not getattr(settings, "CHANNEL_LAYERS", None):
        settings.CHANNEL_LAYERS = channel_layers(settings.REDIS_URL)


@receiver(setting_changed)
def _rebuild(*, setting: str, **_: Any) -> None:
    """override_settings(ABP={...}) is read at the next read, over the defaults."""
    if setting in NAMESPACES:
        _built.pop(setting, None)


@checks.register
def unknown_keys(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """A key the app does not know is most likely a typo of one it does."""
    found: list[checks.CheckMessage] = []
    for name, model in NAMESPACES.items():
        for key in sorted(set(getattr(settings, name, None) or {}) - set(model.model_fields)):
            found.append(
                checks.Warning(
                    f"settings.{name} has a key this app does not read: {key!r}.",
                    hint="docs/operating.md#a-project-of-your-own lists every key.",
                    id="capabilities.W010",
                )
            )
    return found
