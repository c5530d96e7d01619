"""The app's settings: defaults for every key, the host's own merged over them.

A host project sets only what it changes (`ABP = {"MAX_TIMEOUT_MS": 600_000}`); the
rest comes from here, merged once at start (`install`, from the app's `ready`) and
again whenever a test overrides one of these settings. Code reads the merged dicts
through `settings.ABP` (and `settings.ABP_METRICS`, `settings.ABP_STORAGE`) as before.

The other settings the app reads get a default when the host has none: `REDIS_URL`,
`CHANNEL_LAYERS` (this app's Redis pub/sub layer on `REDIS_URL`), `DEVELOPMENT` and the
development superuser's name and password (which a system check looks for).
docs/operating.md#a-project-of-your-own lists them all.
"""

from __future__ import annotations

import copy
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.signals import setting_changed
from django.dispatch import receiver

# Everything the engine reads, in one namespace (like REST_FRAMEWORK). Production-safe:
# no browser origin is trusted and no agent is let in without a credential.
DEFAULTS: dict[str, Any] = {
    "APP_ID": "abp-jobs",
    "APP_NAME": "ABP Jobs",
    "APP_VERSION": "0.1.0",
    "APP_DESCRIPTION": "Cancellable PDF export and image processing for AI agents.",
    # The WebSocket frame limit is enforced by Daphne, which reads it from its command
    # line (--websocket-max-message-size: pass the same number). The embed bridge
    # reads the same number from here to refuse a larger message itself, with a coded
    # error, instead of relaying it and losing the whole socket to a 1009 close.
    "MAX_FRAME_BYTES": 16 * 1024 * 1024,
    # Origins (scheme://host[:port], exact; `:*` for any port) whose pages may embed
    # /abp/embed/ and talk ABP to it by postMessage. The app's own origin always may.
    # Empty: none but the app's own (the demo's development settings allow any port on
    # localhost and 127.0.0.1, so that a local page can embed it without configuration).
    "EMBED_ALLOWED_ORIGINS": [],
    # Browser origins (full, as above) whose pages may open the WebSocket: the origin
    # the app's own pages are served from, and any page using client.js directly.
    # Clients that send no Origin header (agents outside a browser) are not checked
    # here; they need a key. Empty: no browser page may (the demo's development
    # settings allow localhost's).
    "ALLOWED_ORIGINS": [],
    # WebSocket clients with no credential at all are let in (development only: the
    # demo's production settings refuse it; a warning is logged at start).
    "ALLOW_ANONYMOUS": False,
    # The app's pages get a signed token for their WebSocket, valid this long for
    # opening connections (an open connection stays open).
    "PAGE_TOKEN_MAX_AGE_SECONDS": 600,
    # Jobs of one agent key (or client address) running at once: its share of the
    # workers. More wait in the database, queued, and start as its jobs end; other
    # agents' jobs go first while it holds more slots than they do
    # (capabilities/jobs/dispatch.py). An agent key may set its own.
    "MAX_CONCURRENT_CALLS": 16,
    # Calls queued or running at once in one session; more are refused with
    # RATE_LIMITED and retryAfter (QUEUE_FULL_RETRY_AFTER_MS). An agent key may set its own.
    "MAX_QUEUED_CALLS": 1000,
    "QUEUE_FULL_RETRY_AFTER_MS": 1000,
    # Queued jobs that hear their new place in line each time their agent's line
    # moves (progress, stage "queued"); the rest heard it when they were accepted.
    "QUEUE_POSITION_UPDATES": 20,
    # A job handed to Celery but not started after this long is handed over again
    # (its message was lost with a worker); starting is conditional, so it runs once.
    "REDISPATCH_AFTER_SECONDS": 30.0,
    # A call whose row meets the database away (a PostgreSQL restart, a failover) is
    # written again for up to this long before it is refused: it waits, not fails.
    "START_RETRY_SECONDS": 10.0,
    # Live workers: each announces itself this often, in a key that expires after
    # WORKER_TTL_SECONDS (capabilities/jobs/workers.py). A capability whose queue no
    # live worker consumes is unavailable: new calls get CAPABILITY_UNAVAILABLE.
    "WORKER_KEY_PREFIX": "abp:worker:",
    "WORKER_ANNOUNCE_SECONDS": 2.0,
    "WORKER_TTL_SECONDS": 6.0,
    # How stale each process's view of live workers may be, and how often each
    # Daphne looks for a change to tell connected sessions about.
    "AVAILABILITY_POLL_SECONDS": 1.0,
    # An MCP session with no request in flight for this long is ended (its calls
    # were answered); its id then answers 404.
    "MCP_SESSION_IDLE_SECONDS": 30 * 60.0,
    # retryAfter of CAPABILITY_UNAVAILABLE.
    "UNAVAILABLE_RETRY_AFTER_MS": 5000,
    # Calls per minute (sliding window) per agent key, or per client address for
    # page tokens and anonymous clients; more are refused with RATE_LIMITED and
    # retryAfter. An agent key may set its own.
    "CALLS_PER_MINUTE": 120,
    # Abort flags: a key per job with a TTL longer than any job's life, plus a publish.
    "ABORT_KEY_PREFIX": "abp:abort:",
    "ABORT_CHANNEL": "abp:abort",
    "ABORT_TTL_SECONDS": 24 * 3600,
    # A dropped connection's session can be resumed (initialize.resume) this long;
    # then a periodic task cancels its calls (source disconnect). 0: cancel at once.
    "RESUME_GRACE_SECONDS": 60.0,
    # How often beat runs the reaper (capabilities/celery_setup.py): it ends overdue
    # jobs, jobs of lost workers and sessions nobody resumed, and kills workers still on
    # a cancelled job past HARD_KILL_GRACE_SECONDS.
    "REAPER_INTERVAL_SECONDS": 2.0,
    # A running job whose worker has not written a heartbeat for this long is failed
    # with WORKER_LOST (retryable); workers write one every third of it.
    "WORKER_LOST_AFTER_SECONDS": 10.0,
    # A worker still on a cancelled job after this long is killed (SIGKILL).
    "HARD_KILL_GRACE_SECONDS": 3.0,
    # Binary results up to this size are inlined as base64; larger ones are sent as
    # a signed download URL valid for DOWNLOAD_URL_TTL_SECONDS.
    "INLINE_RESULT_MAX_BYTES": 10 * 1024 * 1024,
    "DOWNLOAD_URL_TTL_SECONDS": 3600,
    # Where download URLs point; empty: the host the agent's WebSocket came to.
    "PUBLIC_BASE_URL": "",
    # Result files are deleted this long after their job settled; job rows (and
    # ended sessions without jobs) after JOB_RETENTION_DAYS.
    "RESULT_RETENTION_SECONDS": 24 * 3600,
    "JOB_RETENTION_DAYS": 30,
    # A call without options.timeout still ends after this long.
    "DEFAULT_TIMEOUT_MS": 10 * 60 * 1000,
    "MAX_TIMEOUT_MS": 60 * 60 * 1000,
    # Progress reaches the agent at once; the admin's copy in the DB at most this often.
    "PROGRESS_DB_INTERVAL_SECONDS": 0.5,
    # export.pdf
    "MAX_HTML_BYTES": 5 * 1024 * 1024,
    "MAX_PDF_PAGES": 500,
    "URL_FETCH_ALLOWED_HOSTS": [],
    "URL_FETCH_TIMEOUT_SECONDS": 5.0,
    "URL_FETCH_MAX_BYTES": 5 * 1024 * 1024,
    # export.pdf: largest font a document may load, by the size its header declares
    # once decompressed (WOFF/WOFF2 totalSfntSize and table lengths), checked before
    # anything is decompressed.
    "MAX_FONT_BYTES": 8 * 1024 * 1024,
    # export.pdf: what all of one document's resources (data: URLs and fetched ones)
    # may become in memory together: fonts by declared size, images by decoded pixels
    # (4 bytes each), anything else by its length.
    "MAX_PDF_RESOURCE_BYTES": 256 * 1024 * 1024,
    # export.pdf: most elements after parsing, and deepest nesting; checked before
    # styling and layout, which cost far more per element than parsing. WeasyPrint's
    # layout recursion ends at about 93 levels of inline-blocks and 132 of divs.
    "MAX_PDF_ELEMENTS": 50_000,
    "MAX_PDF_DEPTH": 64,
    # convert.markdownToHtml: largest Markdown input (UTF-8 bytes).
    "MAX_MARKDOWN_BYTES": 1024 * 1024,
    # process.image: largest input image (decoded bytes).
    "MAX_IMAGE_BYTES": 25 * 1024 * 1024,
    # process.image: most pixels of any image (input, intermediate, output); checked on
    # the header, before decoding. Pillow's own MAX_IMAGE_PIXELS (~89 M) caps it.
    "MAX_IMAGE_PIXELS": 50_000_000,
    # process.image: longest side of any image, in pixels.
    "MAX_IMAGE_DIMENSION": 16384,
    # process.image: largest encoded output (bytes).
    "MAX_IMAGE_OUTPUT_BYTES": 50 * 1024 * 1024,
    # Uploads (POST/PUT /abp/uploads, docs/uploads.md): raw bytes a session then names
    # in a call instead of inline base64. Largest body (checked on Content-Length,
    # before it is read; default: the largest binary input a capability takes), and
    # how long an upload may be named in a call; retention deletes it later.
    "MAX_UPLOAD_BYTES": 25 * 1024 * 1024,
    "UPLOAD_TTL_SECONDS": 15 * 60,
    # Address space (RLIMIT_AS) of each worker child, in MiB; 0: no limit. A job that
    # needs more fails cleanly (OPERATION_FAILED, or WORKER_LOST if a library aborts)
    # and the child is replaced, instead of the host running out of memory. About
    # twice the largest job within the other limits (a 50 MP RGBA image to WebP
    # peaked at 1.7-2.0 GiB of address space, ~1.4 GiB resident).
    "WORKER_MEMORY_LIMIT_MB": 4096,
    # Proxies (addresses or networks) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; the client address is the nearest one they name
    # that is not itself a trusted proxy. Empty: the headers are ignored.
    "TRUSTED_PROXIES": [],
    # Calls queued or running at once per agent key (or per client address for page
    # tokens and anonymous clients), across all its sessions (at least its own
    # per-session bound).
    "MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL": 2000,
    # Open sessions per agent key (a key may set its own) or per anonymous client
    # address, across every door: room for a fleet of a few hundred WebSockets on one
    # key. At the bound, the longest-idle MCP session with nothing in flight is ended
    # to make room (docs/security.md#open-sessions). The demo's development settings
    # raise it to 10,000: there every keyless script is one principal (127.0.0.1).
    "MAX_OPEN_SESSIONS_PER_PRINCIPAL": 256,
    # Page tokens are handed to anyone who loads a page, so they get a smaller budget:
    # calls queued or running per client address, calls per minute, the largest call (bytes
    # of its JSON params), the longest timeout, and which capabilities (empty: all).
    "PAGE_TOKEN_MAX_CONCURRENT_CALLS": 4,
    "PAGE_TOKEN_CALLS_PER_MINUTE": 30,
    "PAGE_TOKEN_MAX_PARAMS_BYTES": 1024 * 1024,
    "PAGE_TOKEN_MAX_TIMEOUT_MS": 2 * 60 * 1000,
    # Open sessions per client address with page tokens (anyone who loads a page).
    "PAGE_TOKEN_MAX_OPEN_SESSIONS": 16,
    "PAGE_TOKEN_CAPABILITIES": [],
    # The local lane (docs/design.md#the-local-lane): small calls of these capabilities,
    # with params up to LOCAL_LANE_MAX_PARAMS_BYTES of JSON, run in a pool of
    # LOCAL_LANE_PROCESSES processes beside each Daphne instead of through Celery
    # (0: off), each capped at LOCAL_LANE_MEMORY_LIMIT_MB of address space and killed
    # after LOCAL_LANE_TIME_LIMIT_SECONDS (kept under WORKER_LOST_AFTER_SECONDS: the
    # reaper fails a local run whose Daphne died after that long). Up to
    # LOCAL_LANE_BACKLOG calls per process wait for one; past that, calls go to Celery.
    "LOCAL_LANE_PROCESSES": 1,
    "LOCAL_LANE_BACKLOG": 256,
    "LOCAL_LANE_CAPABILITIES": ["convert.markdownToHtml"],
    "LOCAL_LANE_MAX_PARAMS_BYTES": 64 * 1024,
    "LOCAL_LANE_TIME_LIMIT_SECONDS": 5.0,
    "LOCAL_LANE_MEMORY_LIMIT_MB": 1024,
    # The queue of each cost class, and capabilities moved to another queue
    # (`{"export.pdf": "abp.pdf"}`). A host's partial QUEUES is merged over these.
    "QUEUES": {"small": "abp.small", "heavy": "abp.heavy"},
    "CAPABILITY_QUEUES": {},
}

# /metrics for Prometheus (docs/operating.md#health-and-metrics): off (404) unless a
# bearer token or allowed client addresses (or networks) are set; with both a scrape
# needs both. The windowed metrics cover the last WINDOW_SECONDS.
METRICS_DEFAULTS: dict[str, Any] = {"TOKEN": "", "ALLOWED_IPS": [], "WINDOW_SECONDS": 300.0}

# Downloads of large results: streamed by the web process, or (DOWNLOAD_REDIRECT, on a
# store that signs URLs) a 302 to the store's signed URL, valid at most
# DOWNLOAD_REDIRECT_SECONDS. BACKEND names the kind of STORAGES["default"] in use.
STORAGE_DEFAULTS: dict[str, Any] = {
    "BACKEND": "filesystem",
    "DOWNLOAD_REDIRECT": False,
    "DOWNLOAD_REDIRECT_SECONDS": 60,
}

# The namespaced settings, each merged key by key over its defaults.
NAMESPACES: dict[str, dict[str, Any]] = {
    "ABP": DEFAULTS,
    "ABP_METRICS": METRICS_DEFAULTS,
    "ABP_STORAGE": STORAGE_DEFAULTS,
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


def merged(name: str) -> dict[str, Any]:
    """`settings.<name>` as the app reads it: the host's keys over the defaults.

    A dict-valued key (QUEUES) is merged one level deeper, so a host may move one
    queue and keep the other.
    """
    given: dict[str, Any] = getattr(settings, name, None) or {}
    result = copy.deepcopy(NAMESPACES[name])
    for key, value in given.items():
        default = result.get(key)
        if isinstance(default, dict) and isinstance(value, dict):
            result[key] = {**default, **value}
        else:
            result[key] = value
    return result


def channel_layers(redis_url: str) -> dict[str, Any]:
    """The channel layer the app needs when the host has none: pub/sub on `redis_url`."""
    return {"default": {"BACKEND": CHANNEL_LAYER_BACKEND, "CONFIG": {"hosts": [redis_url]}}}


def install() -> None:
    """Merge the host's settings over the defaults (app start, and on change)."""
    for name in NAMESPACES:
        _install(name)
    for name, value in PLAIN_DEFAULTS.items():
        if not hasattr(settings, name):
            setattr(settings, name, value)
    if not getattr(settings, "CHANNEL_LAYERS", None):
        settings.CHANNEL_LAYERS = channel_layers(settings.REDIS_URL)


def _install(name: str) -> None:
    value = merged(name)
    # A complete dict stays the same object: nothing that holds it is surprised.
    if value != getattr(settings, name, None):
        setattr(settings, name, value)


@receiver(setting_changed)
def _reinstall(*, setting: str, **_: Any) -> None:
    """override_settings(ABP={...}) gets the defaults under it too."""
    if setting in NAMESPACES:
        _install(setting)


@checks.register
def unknown_keys(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """A key the app does not know is most likely a typo of one it does."""
    found: list[checks.CheckMessage] = []
    for name, defaults in NAMESPACES.items():
        for key in sorted(set(getattr(settings, name, None) or {}) - set(defaults)):
            found.append(
                checks.Warning(
                    f"settings.{name} has a key this app does not read: {key!r}.",
                    hint="docs/operating.md#a-project-of-your-own lists every key.",
                    id="capabilities.W010",
                )
            )
    return found
