"""Django settings: the only module that reads the environment.

Every key is listed, with its default, in `.env.example`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from abpsite.safety import DEVELOPMENT_SECRET_KEY, production_problems
from abpsite.static_headers import add_headers

# Lets admin.ModelAdmin[Job] and friends be subscripted at run time, as typed.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value in (None, "") else float(value)


def _origin_of(url: str) -> list[str]:
    parts = urlsplit(url)
    return [f"{parts.scheme}://{parts.netloc}"] if parts.scheme and parts.netloc else []


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _env_map(name: str) -> dict[str, str]:
    """`key=value,key=value` from the environment."""
    pairs = (item.partition("=") for item in _env_list(name))
    return {key.strip(): value.strip() for key, _, value in pairs if key.strip() and value.strip()}


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
ASGI_APPLICATION = "abpsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
ABP_STORAGE: dict[str, Any] = {
    "BACKEND": _STORAGE_BACKEND,
    "DOWNLOAD_REDIRECT": _env_bool("ABP_DOWNLOAD_REDIRECT", False),
    "DOWNLOAD_REDIRECT_SECONDS": _env_int("ABP_DOWNLOAD_REDIRECT_SECONDS", 60),
}
if ABP_STORAGE["DOWNLOAD_REDIRECT"] and _STORAGE_BACKEND == "filesystem":
    raise ImproperlyConfigured("ABP_DOWNLOAD_REDIRECT needs a store that signs URLs (s3).")
if not 1 <= ABP_STORAGE["DOWNLOAD_REDIRECT_SECONDS"] <= 7 * 24 * 3600:
    raise ImproperlyConfigured("ABP_DOWNLOAD_REDIRECT_SECONDS must be 1 to 604800 (7 days).")
# Served straight from the apps' and STATICFILES_DIRS' folders: no collectstatic step
# to forget; WhiteNoise answers with CORS allowed (module imports from other sites).
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
        "CONFIG": {"hosts": [os.environ.get("CHANNEL_LAYER_REDIS_URL", REDIS_URL)]},
    }
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
# One Celery queue per cost class, each with workers of its own, so a small call never
# waits behind a long render (capabilities/jobs/queue.py; docs/operating.md#queues).
SMALL_QUEUE = os.environ.get("ABP_SMALL_QUEUE", "abp.small")
HEAVY_QUEUE = os.environ.get("ABP_HEAVY_QUEUE", "abp.heavy")
CELERY_TASK_DEFAULT_QUEUE = HEAVY_QUEUE
# Housekeeping is small work: the reaper must not wait behind renders.
CELERY_TASK_ROUTES = {
    "abp.reap": {"queue": SMALL_QUEUE},
    "abp.clean_up": {"queue": SMALL_QUEUE},
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Tasks are acknowledged when a worker takes them. What makes a call durable is its
# job row: a worker that dies mid-job gets the job failed with WORKER_LOST (by
# heartbeat), and a redelivered task never restarts a job. With late acks, kombu 5.7
# requeues unacknowledged tasks when the broker connection drops and the worker
# exits on that (a Redis restart killed it; tests/test_redis_restart.py).
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
CELERY_BEAT_SCHEDULE = {
    "abp-reap": {
        "task": "abp.reap",
        "schedule": _env_float("ABP_REAPER_INTERVAL_SECONDS", 2.0),
    },
    "abp-clean-up": {"task": "abp.clean_up", "schedule": 3600.0},
}

_LOCAL_ORIGINS = "http://localhost:*,http://127.0.0.1:*"

# Everything the ABP engine reads, in one namespace (like REST_FRAMEWORK).
ABP: dict[str, Any] = {
    "APP_ID": os.environ.get("ABP_APP_ID", "abp-jobs"),
    "APP_NAME": os.environ.get("ABP_APP_NAME", "ABP Jobs"),
    "APP_VERSION": "0.1.0",
    "APP_DESCRIPTION": "Cancellable PDF export and image processing for AI agents.",
    # The WebSocket frame limit (ABP_MAX_FRAME_BYTES) is enforced by Daphne, which
    # reads it from its command line (Procfile, docker-compose.yml). The embed bridge
    # reads the same number from here to refuse a larger message itself, with a coded
    # error, instead of relaying it and losing the whole socket to a 1009 close.
    "MAX_FRAME_BYTES": _env_int("ABP_MAX_FRAME_BYTES", 16 * 1024 * 1024),
    # Origins (scheme://host[:port], exact; `:*` for any port) whose pages may embed
    # /abp/embed/ and talk ABP to it by postMessage. The app's own origin always may.
    # Empty in production unless set; in DEBUG it defaults to any port on localhost and
    # 127.0.0.1, so that a local page can embed the app without configuration.
    "EMBED_ALLOWED_ORIGINS": _env_list(
        "ABP_EMBED_ALLOWED_ORIGINS", _LOCAL_ORIGINS if DEVELOPMENT else ""
    ),
    # Browser origins (full, as above) whose pages may open the WebSocket: the origin
    # the app's own pages are served from, and any page using client.js directly.
    # Clients that send no Origin header (agents outside a browser) are not checked
    # here; they need a key. Required in production.
    "ALLOWED_ORIGINS": _env_list("ABP_ALLOWED_ORIGINS", _LOCAL_ORIGINS if DEVELOPMENT else ""),
    # WebSocket clients with no credential at all are let in (development only:
    # production refuses to start with it on; a warning is logged at start).
    "ALLOW_ANONYMOUS": _env_bool("ABP_ALLOW_ANONYMOUS", DEVELOPMENT),
    # The app's pages get a signed token for their WebSocket, valid this long for
    # opening connections (an open connection stays open).
    "PAGE_TOKEN_MAX_AGE_SECONDS": _env_int("ABP_PAGE_TOKEN_MAX_AGE_SECONDS", 600),
    # Jobs of one agent key (or client address) running at once: its share of the
    # workers. More wait in the database, queued, and start as its jobs end; other
    # agents' jobs go first while it holds more slots than they do
    # (capabilities/jobs/dispatch.py). An agent key may set its own.
    "MAX_CONCURRENT_CALLS": _env_int("ABP_MAX_CONCURRENT_CALLS", 16),
    # Calls queued or running at once in one session; more are refused with
    # RATE_LIMITED and retryAfter (QUEUE_FULL_RETRY_AFTER_MS). An agent key may set its own.
    "MAX_QUEUED_CALLS": _env_int("ABP_MAX_QUEUED_CALLS", 1000),
    "QUEUE_FULL_RETRY_AFTER_MS": _env_int("ABP_QUEUE_FULL_RETRY_AFTER_MS", 1000),
    # Queued jobs that hear their new place in line each time their agent's line
    # moves (progress, stage "queued"); the rest heard it when they were accepted.
    "QUEUE_POSITION_UPDATES": _env_int("ABP_QUEUE_POSITION_UPDATES", 20),
    # A job handed to Celery but not started after this long is handed over again
    # (its message was lost with a worker); starting is conditional, so it runs once.
    "REDISPATCH_AFTER_SECONDS": _env_float("ABP_REDISPATCH_AFTER_SECONDS", 30.0),
    # Live workers: each announces itself this often, in a key that expires after
    # WORKER_TTL_SECONDS (capabilities/jobs/workers.py). A capability whose queue no
    # live worker consumes is unavailable: new calls get CAPABILITY_UNAVAILABLE.
    "WORKER_KEY_PREFIX": os.environ.get("ABP_WORKER_KEY_PREFIX", "abp:worker:"),
    "WORKER_ANNOUNCE_SECONDS": _env_float("ABP_WORKER_ANNOUNCE_SECONDS", 2.0),
    "WORKER_TTL_SECONDS": _env_float("ABP_WORKER_TTL_SECONDS", 6.0),
    # How stale each process's view of live workers may be, and how often each
    # Daphne looks for a change to tell connected sessions about.
    "AVAILABILITY_POLL_SECONDS": _env_float("ABP_AVAILABILITY_POLL_SECONDS", 1.0),
    # An MCP session with no request in flight for this long is ended (its calls
    # were answered); its id then answers 404.
    "MCP_SESSION_IDLE_SECONDS": _env_float("ABP_MCP_SESSION_IDLE_SECONDS", 30 * 60.0),
    # retryAfter of CAPABILITY_UNAVAILABLE.
    "UNAVAILABLE_RETRY_AFTER_MS": _env_int("ABP_UNAVAILABLE_RETRY_AFTER_MS", 5000),
    # Calls per minute (sliding window) per agent key, or per client address for
    # page tokens and anonymous clients; more are refused with RATE_LIMITED and
    # retryAfter. An agent key may set its own.
    "CALLS_PER_MINUTE": _env_int("ABP_CALLS_PER_MINUTE", 120),
    # Abort flags: a key per job with a TTL longer than any job's life, plus a publish.
    "ABORT_KEY_PREFIX": os.environ.get("ABP_ABORT_KEY_PREFIX", "abp:abort:"),
    "ABORT_CHANNEL": os.environ.get("ABP_ABORT_CHANNEL", "abp:abort"),
    "ABORT_TTL_SECONDS": _env_int("ABP_ABORT_TTL_SECONDS", 24 * 3600),
    # A dropped connection's session can be resumed (initialize.resume) this long;
    # then a periodic task cancels its calls (source disconnect). 0: cancel at once.
    "RESUME_GRACE_SECONDS": _env_float("ABP_RESUME_GRACE_SECONDS", 60.0),
    # A running job whose worker has not written a heartbeat for this long is failed
    # with WORKER_LOST (retryable); workers write one every third of it.
    "WORKER_LOST_AFTER_SECONDS": _env_float("ABP_WORKER_LOST_AFTER_SECONDS", 10.0),
    # A worker still on a cancelled job after this long is killed (SIGKILL).
    "HARD_KILL_GRACE_SECONDS": _env_float("ABP_HARD_KILL_GRACE_SECONDS", 3.0),
    # Binary results up to this size are inlined as base64; larger ones are sent as
    # a signed download URL valid for DOWNLOAD_URL_TTL_SECONDS.
    "INLINE_RESULT_MAX_BYTES": _env_int("ABP_INLINE_RESULT_MAX_BYTES", 10 * 1024 * 1024),
    "DOWNLOAD_URL_TTL_SECONDS": _env_int("ABP_DOWNLOAD_URL_TTL_SECONDS", 3600),
    # Where download URLs point; empty: the host the agent's WebSocket came to.
    "PUBLIC_BASE_URL": os.environ.get("ABP_PUBLIC_BASE_URL", ""),
    # Result files are deleted this long after their job settled; job rows (and
    # ended sessions without jobs) after JOB_RETENTION_DAYS.
    "RESULT_RETENTION_SECONDS": _env_int("ABP_RESULT_RETENTION_SECONDS", 24 * 3600),
    "JOB_RETENTION_DAYS": _env_int("ABP_JOB_RETENTION_DAYS", 30),
    # A call without options.timeout still ends after this long.
    "DEFAULT_TIMEOUT_MS": _env_int("ABP_DEFAULT_TIMEOUT_MS", 10 * 60 * 1000),
    "MAX_TIMEOUT_MS": _env_int("ABP_MAX_TIMEOUT_MS", 60 * 60 * 1000),
    # Progress reaches the agent at once; the admin's copy in the DB at most this often.
    "PROGRESS_DB_INTERVAL_SECONDS": _env_float("ABP_PROGRESS_DB_INTERVAL_SECONDS", 0.5),
    # export.pdf
    "MAX_HTML_BYTES": _env_int("ABP_MAX_HTML_BYTES", 5 * 1024 * 1024),
    "MAX_PDF_PAGES": _env_int("ABP_MAX_PDF_PAGES", 500),
    "URL_FETCH_ALLOWED_HOSTS": _env_list("ABP_URL_FETCH_ALLOWED_HOSTS"),
    "URL_FETCH_TIMEOUT_SECONDS": _env_float("ABP_URL_FETCH_TIMEOUT_SECONDS", 5.0),
    "URL_FETCH_MAX_BYTES": _env_int("ABP_URL_FETCH_MAX_BYTES", 5 * 1024 * 1024),
    # export.pdf: largest font a document may load, by the size its header declares
    # once decompressed (WOFF/WOFF2 totalSfntSize and table lengths), checked before
    # anything is decompressed.
    "MAX_FONT_BYTES": _env_int("ABP_MAX_FONT_BYTES", 8 * 1024 * 1024),
    # export.pdf: what all of one document's resources (data: URLs and fetched ones)
    # may become in memory together: fonts by declared size, images by decoded pixels
    # (4 bytes each), anything else by its length.
    "MAX_PDF_RESOURCE_BYTES": _env_int("ABP_MAX_PDF_RESOURCE_BYTES", 256 * 1024 * 1024),
    # export.pdf: most elements after parsing, and deepest nesting; checked before
    # styling and layout, which cost far more per element than parsing. WeasyPrint's
    # layout recursion ends at about 93 levels of inline-blocks and 132 of divs.
    "MAX_PDF_ELEMENTS": _env_int("ABP_MAX_PDF_ELEMENTS", 50_000),
    "MAX_PDF_DEPTH": _env_int("ABP_MAX_PDF_DEPTH", 64),
    # convert.markdownToHtml: largest Markdown input (UTF-8 bytes).
    "MAX_MARKDOWN_BYTES": _env_int("ABP_MAX_MARKDOWN_BYTES", 1024 * 1024),
    # process.image: largest input image (decoded bytes).
    "MAX_IMAGE_BYTES": _env_int("ABP_MAX_IMAGE_BYTES", 25 * 1024 * 1024),
    # process.image: most pixels of any image (input, intermediate, output); checked on
    # the header, before decoding. Pillow's own MAX_IMAGE_PIXELS (~89 M) caps it.
    "MAX_IMAGE_PIXELS": _env_int("ABP_MAX_IMAGE_PIXELS", 50_000_000),
    # process.image: longest side of any image, in pixels.
    "MAX_IMAGE_DIMENSION": _env_int("ABP_MAX_IMAGE_DIMENSION", 16384),
    # process.image: largest encoded output (bytes).
    "MAX_IMAGE_OUTPUT_BYTES": _env_int("ABP_MAX_IMAGE_OUTPUT_BYTES", 50 * 1024 * 1024),
    # Uploads (POST/PUT /abp/uploads, docs/uploads.md): raw bytes a session then names
    # in a call instead of inline base64. Largest body (checked on Content-Length,
    # before it is read; default: the largest binary input a capability takes), and
    # how long an upload may be named in a call; retention deletes it later.
    "MAX_UPLOAD_BYTES": _env_int(
        "ABP_MAX_UPLOAD_BYTES", _env_int("ABP_MAX_IMAGE_BYTES", 25 * 1024 * 1024)
    ),
    "UPLOAD_TTL_SECONDS": _env_int("ABP_UPLOAD_TTL_SECONDS", 15 * 60),
    # Address space (RLIMIT_AS) of each worker child, in MiB; 0: no limit. A job that
    # needs more fails cleanly (OPERATION_FAILED, or WORKER_LOST if a library aborts)
    # and the child is replaced, instead of the host running out of memory. About
    # twice the largest job within the other limits (a 50 MP RGBA image to WebP
    # peaked at 1.7-2.0 GiB of address space, ~1.4 GiB resident).
    "WORKER_MEMORY_LIMIT_MB": _env_int("ABP_WORKER_MEMORY_LIMIT_MB", 4096),
    # Proxies (addresses or networks, comma-separated) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; the client address is the nearest one they name
    # that is not itself a trusted proxy. Empty: the headers are ignored.
    "TRUSTED_PROXIES": _env_list("ABP_TRUSTED_PROXIES"),
    # Calls queued or running at once per agent key (or per client address for page
    # tokens and anonymous clients), across all its sessions (at least its own
    # per-session bound).
    "MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": _env_int("ABP_MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL", 2000),
    # Open sessions per agent key (a key may set its own) or per anonymous client
    # address, across every door: room for a fleet of a few hundred WebSockets on one
    # key. At the bound, the longest-idle MCP session with nothing in flight is ended
    # to make room (docs/security.md#open-sessions). In development every keyless
    # script is one principal (127.0.0.1): roomy, so a developer never meets 4429.
    "MAX_OPEN_SESSIONS_PER_PRINCIPAL": _env_int(
        "ABP_MAX_OPEN_SESSIONS_PER_PRINCIPAL", 10_000 if DEVELOPMENT else 256
    ),
    # Page tokens are handed to anyone who loads a page, so they get a smaller budget:
    # calls queued or running per client address, calls per minute, the largest call (bytes
    # of its JSON params), the longest timeout, and which capabilities (empty: all).
    "PAGE_TOKEN_MAX_CONCURRENT_CALLS": _env_int("ABP_PAGE_TOKEN_MAX_CONCURRENT_CALLS", 4),
    "PAGE_TOKEN_CALLS_PER_MINUTE": _env_int("ABP_PAGE_TOKEN_CALLS_PER_MINUTE", 30),
    "PAGE_TOKEN_MAX_PARAMS_BYTES": _env_int("ABP_PAGE_TOKEN_MAX_PARAMS_BYTES", 1024 * 1024),
    "PAGE_TOKEN_MAX_TIMEOUT_MS": _env_int("ABP_PAGE_TOKEN_MAX_TIMEOUT_MS", 2 * 60 * 1000),
    # Open sessions per client address with page tokens (anyone who loads a page).
    "PAGE_TOKEN_MAX_OPEN_SESSIONS": _env_int("ABP_PAGE_TOKEN_MAX_OPEN_SESSIONS", 16),
    "PAGE_TOKEN_CAPABILITIES": _env_list("ABP_PAGE_TOKEN_CAPABILITIES"),
    # The local lane (docs/design.md#the-local-lane): small calls of these capabilities,
    # with params up to LOCAL_LANE_MAX_PARAMS_BYTES of JSON, run in a pool of
    # LOCAL_LANE_PROCESSES processes beside each Daphne instead of through Celery
    # (0: off), each capped at LOCAL_LANE_MEMORY_LIMIT_MB of address space and killed
    # after LOCAL_LANE_TIME_LIMIT_SECONDS (kept under WORKER_LOST_AFTER_SECONDS: the
    # reaper fails a local run whose Daphne died after that long).
    "LOCAL_LANE_PROCESSES": _env_int("ABP_LOCAL_LANE_PROCESSES", 1),
    "LOCAL_LANE_CAPABILITIES": _env_list("ABP_LOCAL_LANE_CAPABILITIES", "convert.markdownToHtml"),
    "LOCAL_LANE_MAX_PARAMS_BYTES": _env_int("ABP_LOCAL_LANE_MAX_PARAMS_BYTES", 64 * 1024),
    "LOCAL_LANE_TIME_LIMIT_SECONDS": _env_float("ABP_LOCAL_LANE_TIME_LIMIT_SECONDS", 5.0),
    "LOCAL_LANE_MEMORY_LIMIT_MB": _env_int("ABP_LOCAL_LANE_MEMORY_LIMIT_MB", 1024),
    # The queue of each cost class, and capabilities moved to another queue
    # (`ABP_CAPABILITY_QUEUES=export.pdf=abp.pdf,...`).
    "QUEUES": {"small": SMALL_QUEUE, "heavy": HEAVY_QUEUE},
    "CAPABILITY_QUEUES": _env_map("ABP_CAPABILITY_QUEUES"),
    # Dotted paths of extra CapabilitySpec objects (test settings add a test-only one).
    "EXTRA_CAPABILITIES": [],
}

# `manage.py ensure_dev_superuser` (run by `make run`) creates this user; it refuses
# to run unless DEBUG is on.
DEV_SUPERUSER_USERNAME = os.environ.get("DJANGO_DEV_SUPERUSER_USERNAME", "admin")
DEV_SUPERUSER_PASSWORD = os.environ.get("DJANGO_DEV_SUPERUSER_PASSWORD", "admin")

# /metrics for Prometheus (capabilities/web/metrics.py; docs/operating.md#health-and-metrics):
# off (404) unless a bearer token or allowed client addresses are set, and with both a
# scrape needs both. Development allows loopback. Addresses (or networks) are the
# client's as resolved through ABP_TRUSTED_PROXIES. The windowed metrics (jobs settled,
# run time, queue wait, cancel to stop) cover the last WINDOW_SECONDS.
ABP_METRICS: dict[str, Any] = {
    "TOKEN": os.environ.get("ABP_METRICS_TOKEN", "").strip(),
    "ALLOWED_IPS": _env_list("ABP_METRICS_ALLOWED_IPS", "127.0.0.1,::1" if DEVELOPMENT else ""),
    "WINDOW_SECONDS": _env_float("ABP_METRICS_WINDOW_SECONDS", 300.0),
}
for _entry in ABP_METRICS["ALLOWED_IPS"]:
    try:
        ipaddress.ip_network(_entry, strict=False)
    except ValueError as _error:
        raise ImproperlyConfigured(
            f"ABP_METRICS_ALLOWED_IPS: {_entry!r} is not an IP address or network."
        ) from _error
if not DEVELOPMENT and 0 < len(ABP_METRICS["TOKEN"]) < 32:
    raise ImproperlyConfigured("ABP_METRICS_TOKEN is too short: at least 32 random characters.")
if not 10 <= ABP_METRICS["WINDOW_SECONDS"] <= 24 * 3600:
    raise ImproperlyConfigured("ABP_METRICS_WINDOW_SECONDS must be 10 to 86400.")

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
    "filters": {"revoke_without_backend": {"()": "abpsite.log_filters.RevokeWithoutResultBackend"}},
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
        "celery.worker.control": {"filters": ["revoke_without_backend"]},
    },
}

if not DEVELOPMENT:
    _problems = production_problems(
        debug=DEBUG,
        secret_key=SECRET_KEY,
        allow_anonymous=ABP["ALLOW_ANONYMOUS"],
        allowed_origins=ABP["ALLOWED_ORIGINS"],
        embed_allowed_origins=ABP["EMBED_ALLOWED_ORIGINS"],
        allowed_hosts=ALLOWED_HOSTS,
    )
    if _problems:
        raise ImproperlyConfigured(
            "Refusing to start with unsafe production settings (DJANGO_ENV=production):\n- "
            + "\n- ".join(_problems)
        )
