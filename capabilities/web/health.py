"""Liveness and readiness: `/healthz` and `/readyz`, for compose, proxies and orchestrators.

`/healthz` says the process answers HTTP: it touches neither the database nor Redis,
so a database outage never gets healthy web processes restarted. `/readyz` says this
process can serve calls now: the database answers, each Redis it needs answers, at
least one worker is live, and the process is warm (its local lane's processes loaded,
its connections open: capabilities/calls/warm_up.py). It answers 200 or 503 with a
small JSON body naming each check's result (never an address, a URL or an error
message: only the error's kind), within READY_TIMEOUT_SECONDS, uncached and without
authentication.
`?exclude=workers` (repeatable, or comma-separated) leaves checks out: a load balancer
may want web processes kept in rotation while no worker is live, since they still
answer agents (new calls refused with CAPABILITY_UNAVAILABLE, sessions resumed).
"""

from __future__ import annotations

import asyncio
import contextlib

import redis
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from capabilities.calls import draining, warm_up
from capabilities.web import cluster_state

# The longest /readyz waits for any check; every check runs at the same time.
READY_TIMEOUT_SECONDS = 2.0
CHECKS = ("database", "redis", "workers", "warm", "serving")

_database = cluster_state.Probe("abp-ready-db", threads=2)
_redis = cluster_state.Probe("abp-ready-redis", threads=2)


@require_safe
async def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. No database, no Redis."""
    return _no_store(JsonResponse({"status": "ok"}))


@require_safe
async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 if every check passed, else 503; the body says which failed."""
    excluded = {
        name.strip() for value in request.GET.getlist("exclude") for name in value.split(",")
    }
    checks = {name: "excluded" if name in excluded else "" for name in CHECKS}
    if checks["warm"] != "excluded":
        checks["warm"] = "ok" if warm_up.is_warm() else "warming"
    if checks["serving"] != "excluded":
        checks["serving"] = "draining" if draining.is_draining() else "ok"
    body: dict[str, object] = {}
    await asyncio.gather(_database_check(checks), _redis_checks(checks, body))
    failed = [name for name, result in checks.items() if result not in {"ok", "excluded"}]
    response = JsonResponse(
        {
            "status": "unready" if failed else "ready",
            "checks": checks,
            **({"failed": failed} if failed else {}),
            **body,
        },
        status=503 if failed else 200,
    )
    return _no_store(response)


class _RedisDown(Exception):
    """One of the Redis servers did not answer; `role` says which (never its URL)."""

    def __init__(self, role: str, error: Exception) -> None:
        super().__init__(role)
        self.role = role
        self.error = error


async def _database_check(checks: dict[str, str]) -> None:
    if checks["database"] == "excluded":
        return
    try:
        await _database.run(_select_one, READY_TIMEOUT_SECONDS)
    except Exception as error:
        checks["database"] = _failure(error)
    else:
        checks["database"] = "ok"


async def _redis_checks(checks: dict[str, str], body: dict[str, object]) -> None:
    # One thread does both, in order, filling `found` as it goes: on a timeout, what
    # it finished stands and the rest says "timeout".
    wanted = [name for name in ("redis", "workers") if checks[name] != "excluded"]
    if not wanted:
        return
    found: dict[str, object] = {}
    with contextlib.suppress(TimeoutError):
        await _redis.run(lambda: _read_redis(wanted, found), READY_TIMEOUT_SECONDS)
    results = dict(found)  # the thread may still be writing
    for name in wanted:
        checks[name] = str(results.get(name, "timeout"))
    if "liveWorkers" in results:
        body["liveWorkers"] = results["liveWorkers"]


def _read_redis(wanted: list[str], found: dict[str, object]) -> None:
    if "redis" in wanted:
        try:
            _ping_every_server()
        except Exception as error:
            found["redis"] = _failure(error)
            found["workers"] = "unknown"
            return
        found["redis"] = "ok"
    if "workers" in wanted:
        try:
            live = cluster_state.live_workers()
        except Exception as error:
            found["workers"] = _failure(error)
            return
        found["liveWorkers"] = len(live)
        found["workers"] = "ok" if live else "none live"


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _ping_every_server() -> None:
    for role, url in cluster_state.redis_servers().items():
        try:
            cluster_state.twice(cluster_state.redis_client(url).ping)
        except Exception as error:
            raise _RedisDown(role, error) from error


def _failure(error: BaseException) -> str:
    """What a failed check says: its kind, never its message (it may name a host)."""
    if isinstance(error, _RedisDown):
        kind = _failure(error.error)
        return kind if error.role == "redis" else f"{kind} ({error.role})"
    if isinstance(error, TimeoutError | redis.TimeoutError):
        return "timeout"
    if isinstance(error, redis.ConnectionError):
        return "unreachable"
    if isinstance(error, DatabaseError):
        return f"error ({type(error).__name__})"
    return "error"


def _no_store(response: JsonResponse) -> JsonResponse:
    response["Cache-Control"] = "no-store"
    return response
