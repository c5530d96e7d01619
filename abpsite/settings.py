"""Django settings: the only module that reads the environment.

Every key is listed, with its default, in `.env.example`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel

from abpsite.safety import DEVELOPMENT_SECRET_KEY, production_problems
from abpsite.static_headers import add_headers
from capabilities.config.environment import from_environment
from capabilities.config.schema import AbpSettings, MetricsSettings, Queues, StorageSettings
from capabilities.oauth.provider_settings import mcp_oauth_settings

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _from_environment(model: type[BaseModel], prefix: str, **options: Any) -> dict[str, Any]:
    """The keys of a settings namespace that the environment sets (PREFIX + KEY)."""
    try:
        return from_environment(model, os.environ, prefix=prefix, **options)
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _origin_of(url: str) -> list[str]:
    parts = urlsplit(url)
    return [f"{parts.scheme}://{parts.netloc}"] if parts.scheme and parts.netloc else []


def _env_list(name: str, default: str | list[str] = "") -> list[str]:
    """A comma-separated list from the environment; unset: `default` (a list, or text)."""
    value = os.environ.get(name)
    if value is None and isinstance(default, list):
        return list(default)
    text = default if value is None else value
    assert isinstance(text, str)
    return [item.strip() for item in text.split(",") if item.strip()]


# "production" (the default: every security default on, unsafe values refused at
# start) or "development" (`make run`: DEBUG, anonymous agents, a built-in key).
ENVIRONMENT = os.environ.get("DJANGO_ENV", "production").strip().lower()
if ENVIRONMENT not in {"production", "development"}:
    raise ImproperlyConfigured("DJANGO_ENV must be `production` or `development`.")
DEVELOPMENT = ENVIRONMENT == "development"

DEBUG = _env_bool("DJANGO_DEBUG", DEVELOPMENT)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY and DEVELOPMENT:
    SECRET_KEY = DEVELOPMENT_SECRET_KEY

ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost")

# Cookies only over HTTPS, never readable by scripts. Only the admin sets any.
SESSION_COOKIE_SECURE = _env_bool("DJANGO_SECURE_COOKIES", not DEVELOPMENT)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Behind a proxy that terminates TLS: trust its X-Forwarded-Proto (only set this when
# the proxy always overwrites that header).
if _env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = _env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = _env_int("DJANGO_SECURE_HSTS_SECONDS", 0)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "csp",
    "axes",
    "oauth2_provider",
    "capabilities",
]

MIDDLEWARE = [
    # /healthz and /readyz before host validation and the HTTPS redirect.
    "capabilities.web.probes.probes_first",
    "django.middleware.security.SecurityMiddleware",
    # Daphne serves no static files: WhiteNoise serves the admin's and ours.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: turns a lockout into its answer (429).
    "axes.middleware.AxesMiddleware",
]

# django-axes first: it refuses a locked-out login before the password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# Failed admin logins are throttled per account and client address (django-axes):
# after AXES_FAILURE_LIMIT failures that pair is refused, even with the right
# password, for AXES_COOLOFF_TIME (0 minutes: until `manage.py axes_reset`); another
# address, or another account, is not. The address is REMOTE_ADDR alone, which the
# ASGI stack resolves through trusted proxies: axes never reads X-Forwarded-For.
_ADMIN_LOGIN_COOLOFF_MINUTES = _env_int("DJANGO_ADMIN_LOGIN_COOLOFF_MINUTES", 15)
AXES_FAILURE_LIMIT = _env_int("DJANGO_ADMIN_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = _ADMIN_LOGIN_COOLOFF_MINUTES / 60  # hours, as axes reads a float
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)
AXES_RESET_ON_SUCCESS = True
AXES_COOLOFF_MESSAGE = (
    "Too many failed logins for this account from your address: "
    f"try again in {_ADMIN_LOGIN_COOLOFF_MINUTES} minutes."
)
AXES_PERMALOCK_MESSAGE = (
    "Too many failed logins for this account from your address: an operator must unlock it."
)

# Every page gets a Content-Security-Policy: scripts and connections to this origin
# only, nothing framed from elsewhere, framed by nobody (the embed page widens
# frame-ancestors to ABP_EMBED_ALLOWED_ORIGINS). Inline styles stay allowed: the
# admin's status pills and progress bars use style attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "frame-src": ["'self'", "blob:"],
        # Download URLs may point at ABP_PUBLIC_BASE_URL; pages fetch them.
        "connect-src": ["'self'", *_origin_of(os.environ.get("ABP_PUBLIC_BASE_URL", ""))],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

ROOT_URLCONF = "abpsite.urls"

# OAuth 2.1 for MCP clients (the `[oauth]` extra): this site is its own authorization
# server, set up as MCP needs (docs/security.md#oauth-for-mcp-clients). Behind a proxy,
# name the public issuer and /mcp URL, so metadata, `iss` and audiences agree.
OAUTH2_PROVIDER = mcp_oauth_settings(
    OIDC_ISS_ENDPOINT=os.environ.get("DJANGO_OAUTH_ISSUER", ""),
    OAUTH2_PROTECTED_RESOURCE_IDENTIFIER=os.environ.get("DJANGO_OAUTH_MCP_RESOURCE", ""),
    OAUTH2_PROTECTED_RESOURCE_NAME="abp-jobs",
)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "index"
LOGOUT_REDIRECT_URL = "index"
ASGI_APPLICATION = "abpsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The demo's own pages here; the app's templates are in its package (APP_DIRS).
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Database: SQLite (WAL, busy timeout, IMMEDIATE transactions) unless DATABASE_URL says
# otherwise (PostgreSQL in production). Connections are kept open: Channels'
# database_sync_to_async closes connections older than CONN_MAX_AGE around every call,
# and reopening SQLite (and re-running its PRAGMAs) on each cancel would cost more than
# the cancel itself.
#
# No CONN_HEALTH_CHECKS: Django runs its `SELECT 1` before the first query of every
# request, and under Channels every database_sync_to_async call is one, which cost two
# extra round trips per small call (bench/postgres_hops.py). A PostgreSQL connection is
# replaced once it is CONN_MAX_AGE old instead, when a call starts, so one that sat idle
# long enough for a proxy or firewall to drop it is never used; one that breaks while in
# use (the server restarted) fails that call's query, and Django closes it after the
# call. Not Django's pool: it needs CONN_MAX_AGE = 0, a checkout on every call, and a
# pool must not cross the Celery prefork fork. Celery closes its own connections
# (CELERY_DB_REUSE_MAX below).
DATABASES: dict[str, Any] = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        conn_max_age=60,
        conn_health_checks=False,
    )
}
# Behind PgBouncer in transaction mode (docs/scaling.md): no server-side cursors, as
# Django asks; its psycopg backend already prepares no statements on the server.
if _env_bool("DATABASE_PGBOUNCER", False):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        # synchronous=NORMAL is safe in WAL mode (no corruption; a power cut may lose
        # the last commits) and avoids an fsync on every settle.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file cannot be dropped by the network: kept for the process's life.
    DATABASES["default"]["CONN_MAX_AGE"] = None

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The demo's own assets (static/abpsite/); the app's are in its package.
STATICFILES_DIRS = [BASE_DIR / "static"]
# Only for `collectstatic` (e.g. to hand the files to a CDN): WhiteNoise serves them
# from the apps' folders without it.
STATIC_ROOT = (
    Path(os.environ["DJANGO_STATIC_ROOT"]) if os.environ.get("DJANGO_STATIC_ROOT") else None
)
MEDIA_ROOT = Path(os.environ.get("DJANGO_MEDIA_ROOT", BASE_DIR / "var" / "media"))
MEDIA_URL = "media/"

# Result files and spilled inputs go through Django's default storage, so any
# django-storages backend works (a settings module of your own may set STORAGES).
# From the environment: the filesystem under MEDIA_ROOT (the default; all web and
# worker processes must share it), or an S3-compatible bucket (Amazon S3, MinIO,
# Cloudflare R2). docs/operating.md#storage.
_STORAGE_BACKEND = os.environ.get("ABP_STORAGE_BACKEND", "").strip().lower() or "filesystem"
_default_storage: dict[str, Any] = {"BACKEND": "django.core.files.storage.FileSystemStorage"}
if _STORAGE_BACKEND == "s3":
    _s3_options: dict[str, Any] = {
        "bucket_name": os.environ.get("ABP_S3_BUCKET", "").strip(),
        # Empty: Amazon S3. MinIO, R2 and others: their endpoint.
        "endpoint_url": os.environ.get("ABP_S3_ENDPOINT_URL", "").strip() or None,
        "region_name": os.environ.get("ABP_S3_REGION", "").strip() or None,
        # Key prefix inside the bucket (a bucket shared with other things).
        "location": os.environ.get("ABP_S3_PREFIX", "").strip().strip("/"),
        # "path" or "virtual"; empty: botocore's choice.
        "addressing_style": os.environ.get("ABP_S3_ADDRESSING_STYLE", "").strip() or None,
        # Private objects; only signed (SigV4) URLs, never a public custom-domain one.
        "default_acl": None,
        "querystring_auth": True,
        "signature_version": "s3v4",
        "custom_domain": None,
        # Files read back whole (inline results, spilled inputs) go to a temporary
        # file past this; downloads stream the object's body instead.
        "max_memory_size": 2 * 1024 * 1024,
    }
    # Keys: these, else what boto3 finds itself (AWS_ACCESS_KEY_ID and
    # AWS_SECRET_ACCESS_KEY, a profile, an instance or task role).
    if os.environ.get("ABP_S3_ACCESS_KEY_ID"):
        _s3_options["access_key"] = os.environ["ABP_S3_ACCESS_KEY_ID"]
        _s3_options["secret_key"] = os.environ.get("ABP_S3_SECRET_ACCESS_KEY", "")
    if not _s3_options["bucket_name"]:
        raise ImproperlyConfigured("ABP_STORAGE_BACKEND=s3 needs ABP_S3_BUCKET.")
    _default_storage = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": _s3_options}
elif _STORAGE_BACKEND != "filesystem":
    raise ImproperlyConfigured(
        f"ABP_STORAGE_BACKEND must be filesystem or s3, not {_STORAGE_BACKEND!r}."
    )
STORAGES: dict[str, dict[str, Any]] = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Large results' download URLs are always ours (/abp/files/...: session, expiry and
# retention checked first). Then the web process streams the file (the default), or,
# with ABP_DOWNLOAD_REDIRECT on a store that signs URLs (S3), answers 302 with the
# store's signed URL, valid ABP_DOWNLOAD_REDIRECT_SECONDS at most.
ABP_STORAGE = _from_environment(
    StorageSettings, "ABP_", under={"BACKEND": _STORAGE_BACKEND}, skip={"BACKEND"}
)
# Served straight from the apps' folders: no collectstatic step to forget; WhiteNoise
# answers with CORS allowed (module imports from other sites).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
WHITENOISE_ADD_HEADERS_FUNCTION = add_headers

# Redis carries three things: the Celery broker, the channel layer (pub/sub) and the
# abort flags. One URL by default; each can be pointed elsewhere.
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6399/0")

CHANNEL_LAYERS = {
    "default": {
        # channels_redis' pub/sub layer: no per-channel lists to poll, measured faster
        # here for the worker -> consumer notes (see bench/channel_layers.py); each call
        # retried once across a Redis restart (capabilities/channel_layer.py).
        "BACKEND": "capabilities.channel_layer.RetryingPubSubChannelLayer",
        # Several URLs, comma-separated: the layer's shards (channels_redis hashes each
        # channel and group to one of them; docs/scaling.md).
        "CONFIG": {"hosts": _env_list("CHANNEL_LAYER_REDIS_URL", REDIS_URL)},
    }
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
if CELERY_BROKER_URL.startswith("redis://"):
    # kombu's Redis transport, but a worker does not die of a Redis restart
    # (capabilities/broker_transport.py).
    CELERY_BROKER_TRANSPORT = "capabilities.broker_transport:Transport"
# One Celery queue per cost class, each with workers of its own, so a small call never
# waits behind a long render (capabilities/jobs/queue.py; docs/operating.md#queues).
SMALL_QUEUE = os.environ.get("ABP_SMALL_QUEUE", "").strip() or Queues().small
HEAVY_QUEUE = os.environ.get("ABP_HEAVY_QUEUE", "").strip() or Queues().heavy
CELERY_TASK_DEFAULT_QUEUE = HEAVY_QUEUE
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Tasks are acknowledged when a worker takes them. What makes a call durable is its
# job row: a worker that dies mid-job gets the job failed with WORKER_LOST (by
# heartbeat), and a redelivered task never restarts a job. With late acks, kombu 5.7
# requeues unacknowledged tasks when the broker connection drops and the worker
# exits on that (a Redis restart killed it; tests/stack/test_redis_restart.py).
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes DB connections around every task unless this is set;
# reconnecting (and re-running SQLite's PRAGMAs) cost more than a small task.
CELERY_DB_REUSE_MAX = 1000
# A child is replaced after a task leaves it above this (KiB). Measured: 106 MiB after
# warm-up, 200-210 MiB after 400-page renders (memory WeasyPrint does not give back).
CELERY_WORKER_MAX_MEMORY_PER_CHILD = _env_int("CELERY_WORKER_MAX_MEMORY_PER_CHILD", 300_000)

_LOCAL_ORIGINS = ["http://localhost:*", "http://127.0.0.1:*"]

# Everything the ABP engine reads, in one namespace (like REST_FRAMEWORK): each key
# from its ABP_<KEY> variable where set, over the app's defaults
# (capabilities/config/schema.py, where each key is explained). Development is more
# permissive: local pages may embed the app and open its WebSocket, agents without a
# key are let in (production refuses that), and every keyless script is one roomy
# principal (127.0.0.1), so a developer never meets 4429.
_DEVELOPMENT_ABP: dict[str, Any] = {
    "EMBED_ALLOWED_ORIGINS": _LOCAL_ORIGINS,
    "ALLOWED_ORIGINS": _LOCAL_ORIGINS,
    "ALLOW_ANONYMOUS": True,
    "MAX_OPEN_SESSIONS_PER_PRINCIPAL": 10_000,
}
ABP = _from_environment(
    AbpSettings,
    "ABP_",
    under={
        **(_DEVELOPMENT_ABP if DEVELOPMENT else {}),
        "QUEUES": {"small": SMALL_QUEUE, "heavy": HEAVY_QUEUE},
    },
    skip={"QUEUES"},
)


# `manage.py ensure_dev_superuser` (run by `make run`) creates this user; it refuses
# to run unless DEBUG is on.
DEV_SUPERUSER_USERNAME = os.environ.get("DJANGO_DEV_SUPERUSER_USERNAME", "admin")
DEV_SUPERUSER_PASSWORD = os.environ.get("DJANGO_DEV_SUPERUSER_PASSWORD", "admin")

# /metrics for Prometheus (capabilities/web/metrics.py; docs/operating.md#health-and-metrics):
# off (404) unless a bearer token or allowed client addresses are set, and with both a
# scrape needs both. Development allows loopback. Addresses (or networks) are the
# client's as resolved through ABP_TRUSTED_PROXIES. The windowed metrics (jobs settled,
# run time, queue wait, cancel to stop) cover the last WINDOW_SECONDS.
ABP_METRICS = _from_environment(
    MetricsSettings,
    "ABP_METRICS_",
    under={"ALLOWED_IPS": ["127.0.0.1", "::1"]} if DEVELOPMENT else {},
)
if not DEVELOPMENT and 0 < len(ABP_METRICS.get("TOKEN", "")) < 32:
    raise ImproperlyConfigured("ABP_METRICS_TOKEN is too short: at least 32 random characters.")

# Logs go to stderr as text (`time level logger: message`) or, with ABP_LOG_FORMAT=json,
# as one JSON object a line (python-json-logger). Job events (capabilities/jobs/events.py:
# created, dispatched, started, settled, stopped, with callId, sessionId, agent,
# capability, queue and door) are logged by `abp.jobs` at INFO when ABP_LOG_JOB_EVENTS
# is on, by default only with JSON logs.
LOG_FORMAT = os.environ.get("ABP_LOG_FORMAT", "").strip().lower() or "text"
if LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"ABP_LOG_FORMAT must be text or json, not {LOG_FORMAT!r}.")
LOG_JOB_EVENTS = _env_bool("ABP_LOG_JOB_EVENTS", LOG_FORMAT == "json")
LOG_LEVEL = os.environ.get("DJANGO_LOG_LEVEL", "INFO")
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Records of abp.* loggers get their fields appended as key=value.
        "plain": {
            "()": "abpsite.log_formats.PlainFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger", "process": "pid"},
            "timestamp": "time",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "abp.jobs": {"level": "INFO" if LOG_JOB_EVENTS else "WARNING"},
        # WeasyPrint's progress logger is read by our own handler, not printed.
        "weasyprint.progress": {"level": "INFO", "propagate": False, "handlers": []},
        "weasyprint": {"level": "ERROR"},
        "fontTools": {"level": "WARNING"},
        # django-axes announces its version at INFO in every process.
        "axes.apps": {"level": "WARNING"},
    },
}

if not DEVELOPMENT:
    _problems = production_problems(
        debug=DEBUG,
        secret_key=SECRET_KEY,
        allow_anonymous=ABP.get("ALLOW_ANONYMOUS", False),
        allowed_origins=ABP.get("ALLOWED_ORIGINS", ()),
        embed_allowed_origins=ABP.get("EMBED_ALLOWED_ORIGINS", ()),
        allowed_hosts=ALLOWED_HOSTS,
    )
    if _problems:
        raise ImproperlyConfigured(
            "Refusing to start with unsafe production settings (DJANGO_ENV=production):\n- "
            + "\n- ".join(_problems)
        )
