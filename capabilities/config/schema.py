"""Every key the app reads, typed, with its default: `settings.ABP`, `ABP_METRICS`, `ABP_STORAGE`.

A host project sets only what it changes (`ABP = {"MAX_TIMEOUT_MS": 600_000}`); the
rest is the default here. The defaults are production-safe: no browser origin is
trusted and no agent is let in without a credential. docs/operating.md lists them all,
and `.env.example` names each one's environment variable (`ABP_` and the key).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from capabilities import __version__

Count = Annotated[int, Field(ge=1)]
Amount = Annotated[int, Field(ge=0)]  # zero allowed (off, none, at once)
Seconds = Annotated[float, Field(gt=0)]
SecondsOrZero = Annotated[float, Field(ge=0)]
Names = tuple[str, ...]


class _Frozen(BaseModel):
    # Unknown keys are not errors: a system check warns of them (capabilities.W010),
    # so a project that still sets a key a newer version dropped keeps starting.
    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=True)


class Queues(_Frozen):
    """The Celery queue of each cost class (capabilities/jobs/queue.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    small: str = Field(default="abp.small", min_length=1)
    heavy: str = Field(default="abp.heavy", min_length=1)

    def names(self) -> tuple[str, str]:
        """Both queues' names."""
        return (self.small, self.heavy)

    def for_cost(self, cost: str) -> str:
        """The queue of a cost class; any other cost names a queue of its own."""
        return {"small": self.small, "heavy": self.heavy}.get(cost, cost)


def _addresses(entries: Names, *, strict: bool) -> Names:
    """Each entry an IP address or network (`strict`: no host bits set); ValueError naming it."""
    for entry in entries:
        try:
            if "/" in entry:
                ipaddress.ip_network(entry, strict=strict)
            else:
                ipaddress.ip_address(entry)
        except ValueError as error:
            raise ValueError(f"{entry!r} is not an IP address or network") from error
    return entries


class AbpSettings(_Frozen):
    """`settings.ABP`: everything the engine reads, in one namespace (like REST_FRAMEWORK)."""

    APP_ID: str = Field(default="abp-jobs", min_length=1)
    APP_NAME: str = "ABP Jobs"
    APP_VERSION: str = __version__
    APP_DESCRIPTION: str = "Cancellable PDF export and image processing for AI agents."
    # The WebSocket frame limit is enforced by Daphne, which reads it from its command
    # line (--websocket-max-message-size: pass the same number). The embed bridge
    # reads the same number from here to refuse a larger message itself, with a coded
    # error, instead of relaying it and losing the whole socket to a 1009 close.
    MAX_FRAME_BYTES: Count = 16 * 1024 * 1024
    # Origins (scheme://host[:port], exact; `:*` for any port) whose pages may embed
    # /abp/embed/ and talk ABP to it by postMessage. The app's own origin always may.
    # Empty: none but the app's own (the demo's development settings allow any port on
    # localhost and 127.0.0.1, so that a local page can embed it without configuration).
    EMBED_ALLOWED_ORIGINS: Names = ()
    # Browser origins (full, as above) whose pages may open the WebSocket: the origin
    # the app's own pages are served from, and any page using client.js directly.
    # Clients that send no Origin header (agents outside a browser) are not checked
    # here; they need a key. Empty: no browser page may (the demo's development
    # settings allow localhost's).
    ALLOWED_ORIGINS: Names = ()
    # WebSocket clients with no credential at all are let in (development only: the
    # demo's production settings refuse it; a warning is logged at start).
    ALLOW_ANONYMOUS: bool = False
    # The app's pages get a signed token for their WebSocket, valid this long for
    # opening connections (an open connection stays open).
    PAGE_TOKEN_MAX_AGE_SECONDS: Count = 600
    # Jobs of one agent key (or client address) running at once: its share of the
    # workers. More wait in the database, queued, and start as its jobs end; other
    # agents' jobs go first while it holds more slots than they do
    # (capabilities/jobs/dispatch.py). An agent key may set its own.
    MAX_CONCURRENT_CALLS: Count = 16
    # Calls queued or running at once in one session; more are refused with
    # RATE_LIMITED and retryAfter (QUEUE_FULL_RETRY_AFTER_MS). An agent key may set its own.
    MAX_QUEUED_CALLS: Count = 1000
    QUEUE_FULL_RETRY_AFTER_MS: Amount = 1000
    # Queued jobs that hear their new place in line each time their agent's line
    # moves (progress, stage "queued"); the rest heard it when they were accepted.
    QUEUE_POSITION_UPDATES: Amount = 20
    # A job handed to Celery but not started after this long is handed over again
    # (its message was lost with a worker); starting is conditional, so it runs once.
    REDISPATCH_AFTER_SECONDS: Seconds = 30.0
    # A call whose row meets the database away (a PostgreSQL restart, a failover) is
    # written again for up to this long before it is refused: it waits, not fails.
    START_RETRY_SECONDS: SecondsOrZero = 10.0
    # Live workers: each announces itself this often, in a key that expires after
    # WORKER_TTL_SECONDS (capabilities/jobs/workers.py). A capability whose queue no
    # live worker consumes is unavailable: new calls get CAPABILITY_UNAVAILABLE.
    WORKER_KEY_PREFIX: str = Field(default="abp:worker:", min_length=1)
    WORKER_ANNOUNCE_SECONDS: Seconds = 2.0
    WORKER_TTL_SECONDS: Seconds = 6.0
    # How stale each process's view of live workers may be, and how often each
    # Daphne looks for a change to tell connected sessions about.
    AVAILABILITY_POLL_SECONDS: SecondsOrZero = 1.0
    # An MCP session with no request in flight for this long is ended (its calls
    # were answered); its id then answers 404.
    MCP_SESSION_IDLE_SECONDS: Seconds = 30 * 60.0
    # retryAfter of CAPABILITY_UNAVAILABLE.
    UNAVAILABLE_RETRY_AFTER_MS: Amount = 5000
    # Calls per minute (sliding window) per agent key, or per client address for
    # page tokens and anonymous clients; more are refused with RATE_LIMITED and
    # retryAfter. An agent key may set its own.
    CALLS_PER_MINUTE: Count = 120
    # Abort flags: a key per job with a TTL longer than any job's life, plus a publish.
    ABORT_KEY_PREFIX: str = Field(default="abp:abort:", min_length=1)
    ABORT_CHANNEL: str = Field(default="abp:abort", min_length=1)
    ABORT_TTL_SECONDS: Count = 24 * 3600
    # A dropped connection's session can be resumed (initialize.resume) this long;
    # then a periodic task cancels its calls (source disconnect). 0: cancel at once.
    RESUME_GRACE_SECONDS: SecondsOrZero = 60.0
    # How often beat runs the reaper (capabilities/celery_setup.py): it ends overdue
    # jobs, jobs of lost workers and sessions nobody resumed, and kills workers still on
    # a cancelled job past HARD_KILL_GRACE_SECONDS.
    REAPER_INTERVAL_SECONDS: Seconds = 2.0
    # A running job whose worker has not written a heartbeat for this long is failed
    # with WORKER_LOST (retryable); workers write one every third of it.
    WORKER_LOST_AFTER_SECONDS: Seconds = 10.0
    # A worker still on a cancelled job after this long is killed (SIGKILL).
    HARD_KILL_GRACE_SECONDS: SecondsOrZero = 3.0
    # Binary results up to this size are inlined as base64; larger ones are sent as
    # a signed download URL valid for DOWNLOAD_URL_TTL_SECONDS.
    INLINE_RESULT_MAX_BYTES: Amount = 10 * 1024 * 1024
    DOWNLOAD_URL_TTL_SECONDS: Count = 3600
    # Where download URLs point; empty: the host the agent's WebSocket came to.
    PUBLIC_BASE_URL: str = ""
    # Result files are deleted this long after their job settled; job rows (and
    # ended sessions without jobs) after JOB_RETENTION_DAYS.
    RESULT_RETENTION_SECONDS: SecondsOrZero = 24 * 3600
    JOB_RETENTION_DAYS: NonNegativeFloat = 30
    # A call without options.timeout still ends after this long.
    DEFAULT_TIMEOUT_MS: Count = 10 * 60 * 1000
    MAX_TIMEOUT_MS: Count = 60 * 60 * 1000
    # Progress reaches the agent at once; the admin's copy in the DB at most this often.
    PROGRESS_DB_INTERVAL_SECONDS: SecondsOrZero = 0.5
    # export.pdf
    MAX_HTML_BYTES: Count = 5 * 1024 * 1024
    MAX_PDF_PAGES: Count = 500
    URL_FETCH_ALLOWED_HOSTS: Names = ()
    URL_FETCH_TIMEOUT_SECONDS: Seconds = 5.0
    URL_FETCH_MAX_BYTES: Count = 5 * 1024 * 1024
    # export.pdf: largest font a document may load, by the size its header declares
    # once decompressed (WOFF/WOFF2 totalSfntSize and table lengths), checked before
    # anything is decompressed.
    MAX_FONT_BYTES: Count = 8 * 1024 * 1024
    # export.pdf: what all of one document's resources (data: URLs and fetched ones)
    # may become in memory together: fonts by declared size, images by decoded pixels
    # (4 bytes each), anything else by its length.
    MAX_PDF_RESOURCE_BYTES: Count = 256 * 1024 * 1024
    # export.pdf: most elements after parsing, and deepest nesting; checked before
    # styling and layout, which cost far more per element than parsing. WeasyPrint's
    # layout recursion ends at about 93 levels of inline-blocks and 132 of divs.
    MAX_PDF_ELEMENTS: Count = 50_000
    MAX_PDF_DEPTH: Count = 64
    # convert.markdownToHtml: largest Markdown input (UTF-8 bytes).
    MAX_MARKDOWN_BYTES: Count = 1024 * 1024
    # process.image: largest input image (decoded bytes).
    MAX_IMAGE_BYTES: Count = 25 * 1024 * 1024
    # process.image: most pixels of any image (input, intermediate, output); checked on
    # the header, before decoding. Pillow's own MAX_IMAGE_PIXELS (~89 M) caps it.
    MAX_IMAGE_PIXELS: Count = 50_000_000
    # process.image: longest side of any image, in pixels.
    MAX_IMAGE_DIMENSION: Count = 16384
    # process.image: largest encoded output (bytes).
    MAX_IMAGE_OUTPUT_BYTES: Count = 50 * 1024 * 1024
    # Uploads (POST/PUT /abp/uploads, docs/uploads.md): raw bytes a session then names
    # in a call instead of inline base64. Largest body (checked on Content-Length,
    # before it is read; unset: MAX_IMAGE_BYTES, the largest binary input a built-in
    # takes), and how long an upload may be named in a call; retention deletes it later.
    MAX_UPLOAD_BYTES: Count = 25 * 1024 * 1024
    UPLOAD_TTL_SECONDS: Count = 15 * 60
    # Address space (RLIMIT_AS) of each worker child, in MiB; 0: no limit. A job that
    # needs more fails cleanly (OPERATION_FAILED, or WORKER_LOST if a library aborts)
    # and the child is replaced, instead of the host running out of memory. About
    # twice the largest job within the other limits (a 50 MP RGBA image to WebP
    # peaked at 1.7-2.0 GiB of address space, ~1.4 GiB resident).
    WORKER_MEMORY_LIMIT_MB: Amount = 4096
    # Proxies (addresses or networks) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; the client address is the nearest one they name
    # that is not itself a trusted proxy. Empty: the headers are ignored.
    TRUSTED_PROXIES: Names = ()
    # Calls queued or running at once per agent key (or per client address for page
    # tokens and anonymous clients), across all its sessions (at least its own
    # per-session bound).
    MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL: Count = 2000
    # Open sessions per agent key (a key may set its own) or per anonymous client
    # address, across every door: room for a fleet of a few hundred WebSockets on one
    # key. At the bound, the longest-idle MCP session with nothing in flight is ended
    # to make room (docs/security.md#open-sessions). The demo's development settings
    # raise it to 10,000: there every keyless script is one principal (127.0.0.1).
    MAX_OPEN_SESSIONS_PER_PRINCIPAL: Count = 256
    # Agent keys one user may hold at once (those not revoked), made on "Your keys"
    # (docs/security.md#keys-a-user-owns); checked before a key is stored. Staff
    # making keys in the admin or with create_agent_key are not bound by it.
    MAX_KEYS_PER_USER: Count = 20
    # OAuth access tokens that are JWTs of an external authorization server, checked
    # against its JWKS (docs/security.md#oauth-for-mcp-clients): its issuer, where its
    # keys are, and the claim that names the Django user (by USERNAME_FIELD). Off
    # while OAUTH_JWKS_URL is empty.
    OAUTH_JWT_ISSUER: str = ""
    OAUTH_JWKS_URL: str = ""
    OAUTH_JWT_USERNAME_CLAIM: str = Field(default="sub", min_length=1)
    # Page tokens are handed to anyone who loads a page, so they get a smaller budget:
    # calls queued or running per client address, calls per minute, the largest call (bytes
    # of its JSON params), the longest timeout, and which capabilities (empty: all).
    PAGE_TOKEN_MAX_CONCURRENT_CALLS: Count = 4
    PAGE_TOKEN_CALLS_PER_MINUTE: Count = 30
    PAGE_TOKEN_MAX_PARAMS_BYTES: Count = 1024 * 1024
    PAGE_TOKEN_MAX_TIMEOUT_MS: Count = 2 * 60 * 1000
    # Open sessions per client address with page tokens (anyone who loads a page).
    PAGE_TOKEN_MAX_OPEN_SESSIONS: Count = 16
    PAGE_TOKEN_CAPABILITIES: Names = ()
    # The local lane (docs/design.md#the-local-lane): small calls of these capabilities,
    # with params up to LOCAL_LANE_MAX_PARAMS_BYTES of JSON, run in a pool of
    # LOCAL_LANE_PROCESSES processes beside each Daphne instead of through Celery
    # (0: off), each capped at LOCAL_LANE_MEMORY_LIMIT_MB of address space and killed
    # after LOCAL_LANE_TIME_LIMIT_SECONDS (kept under WORKER_LOST_AFTER_SECONDS: the
    # reaper fails a local run whose Daphne died after that long; a system check
    # refuses more). Up to LOCAL_LANE_BACKLOG calls per process wait for one; past
    # that, calls go to Celery.
    LOCAL_LANE_PROCESSES: Amount = 1
    LOCAL_LANE_BACKLOG: Amount = 256
    LOCAL_LANE_CAPABILITIES: Names = ("convert.markdownToHtml",)
    LOCAL_LANE_MAX_PARAMS_BYTES: Amount = 64 * 1024
    LOCAL_LANE_TIME_LIMIT_SECONDS: Seconds = 5.0
    LOCAL_LANE_MEMORY_LIMIT_MB: Amount = 1024
    # The queue of each cost class; a host's partial QUEUES keeps the other's default.
    QUEUES: Queues = Queues()
    # Capabilities moved to another queue: `{"export.pdf": "abp.pdf"}`.
    CAPABILITY_QUEUES: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _uploads_follow_images(cls, data: Any) -> Any:
        """Unset, MAX_UPLOAD_BYTES is MAX_IMAGE_BYTES: uploads carry the largest input."""
        if isinstance(data, dict) and "MAX_UPLOAD_BYTES" not in data and "MAX_IMAGE_BYTES" in data:
            return {**data, "MAX_UPLOAD_BYTES": data["MAX_IMAGE_BYTES"]}
        return data

    @field_validator("TRUSTED_PROXIES")
    @classmethod
    def _proxies_are_addresses(cls, entries: Names) -> Names:
        # uvicorn would take `*` as "trust everyone", and anything else it cannot
        # parse as a name no peer ever has.
        return _addresses(entries, strict=True)


class MetricsSettings(_Frozen):
    """`settings.ABP_METRICS`: /metrics for Prometheus (docs/operating.md#health-and-metrics).

    Off (404) unless a bearer token or allowed client addresses (or networks) are set;
    with both a scrape needs both. The windowed metrics cover the last WINDOW_SECONDS.
    """

    TOKEN: str = ""
    ALLOWED_IPS: Names = ()
    WINDOW_SECONDS: float = Field(default=300.0, ge=10, le=24 * 3600)

    @field_validator("ALLOWED_IPS")
    @classmethod
    def _ips_are_addresses(cls, entries: Names) -> Names:
        return _addresses(entries, strict=False)


class StorageSettings(_Frozen):
    """`settings.ABP_STORAGE`: how large results are downloaded.

    Streamed by the web process, or (DOWNLOAD_REDIRECT, on a store that signs URLs) a
    302 to the store's signed URL, valid at most DOWNLOAD_REDIRECT_SECONDS. BACKEND
    names the kind of STORAGES["default"] in use.
    """

    BACKEND: str = "filesystem"
    DOWNLOAD_REDIRECT: bool = False
    DOWNLOAD_REDIRECT_SECONDS: int = Field(default=60, ge=1, le=7 * 24 * 3600)

    @field_validator("DOWNLOAD_REDIRECT")
    @classmethod
    def _redirect_needs_signed_urls(cls, redirect: bool, info: ValidationInfo) -> bool:
        if redirect and info.data.get("BACKEND") == "filesystem":
            raise ValueError("needs a store that signs URLs (s3), not the filesystem")
        return redirect
