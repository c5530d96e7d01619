"""`/abp/jobs/`, "Your jobs": a signed-in user's own jobs from every door, and its JSON API.

The page is for the session's user (a sign-in first, as `login_required`); its
script polls the list and cancels through the API. The API takes the session's
user or an agent key's owner (access/request_user.py):

- `GET /abp/jobs.json` (`?status=`, `?limit=`, `?cursor=`): a page, newest first;
- `GET /abp/jobs/<id>.json`: one job;
- `POST /abp/jobs/<id>/cancel` (optional `{"reason": ...}`): `{id, cancelled, status}`.

Errors are `{"error": {code, message, retryable}}` with a stable code: 401
NOT_AUTHENTICATED, 403 CSRF_FAILED, 404 NOT_FOUND (another user's job is one that
does not exist), 405 METHOD_NOT_ALLOWED, 400 INVALID_PARAMS. A session's POST must
carry its CSRF token, as any form's; a bearer's needs none, as in Django REST
framework: a cross-site page cannot make a browser send an Authorization header.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Concatenate, ParamSpec

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from capabilities.access.request_user import user_for_request
from capabilities.calls import user_jobs
from capabilities.conf import abp_settings
from capabilities.protocol import WireError
from capabilities.protocol.text import unstorable
from capabilities.web.job_json import job_json

P = ParamSpec("P")
View = Callable[Concatenate[HttpRequest, AbstractBaseUser, P], HttpResponse]
Endpoint = Callable[Concatenate[HttpRequest, P], HttpResponse]

# How often the page asks again: while a job it shows is active, and otherwise.
POLL_ACTIVE_MS = 1000
POLL_IDLE_MS = 10_000
DEFAULT_REASON = "cancelled by its user"


class ApiError(StrEnum):
    """The API's error codes (the HTTP status says the same, coarser)."""

    NOT_AUTHENTICATED = "NOT_AUTHENTICATED"
    """401: no signed-in session, and no valid agent key of an active owner."""
    CSRF_FAILED = "CSRF_FAILED"
    """403: a signed-in session's POST without its CSRF token."""
    NOT_FOUND = "NOT_FOUND"
    """404: no job of yours has this id."""
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    """405: another method than the endpoint's."""
    INVALID_PARAMS = "INVALID_PARAMS"
    """400: an unknown status filter, a bad limit, cursor or reason."""


def refused(status: int, code: ApiError, message: str) -> JsonResponse:
    """An error answer: `{"error": {code, message, retryable}}`."""
    error = WireError(code=code, message=message, retryable=False)
    return JsonResponse({"error": error.to_json()}, status=status)


def api(*methods: str) -> Callable[[View[P]], Endpoint[P]]:
    """A JSON endpoint for the request's user: methods, credentials and CSRF checked."""

    def wrap(view: View[P]) -> Endpoint[P]:
        @csrf_exempt
        @never_cache
        @functools.wraps(view)
        def endpoint(request: HttpRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
            if request.method not in methods:
                answer = refused(405, ApiError.METHOD_NOT_ALLOWED, f"Use {' or '.join(methods)}.")
                answer["Allow"] = ", ".join(methods)
                return answer
            user = user_for_request(request)
            if user is None:
                answer = refused(
                    401,
                    ApiError.NOT_AUTHENTICATED,
                    "Sign in, or send an agent key you own as `Authorization: Bearer`.",
                )
                answer["WWW-Authenticate"] = 'Bearer realm="abp"'
                return answer
            if request.method == "POST" and _signed_in(request) and _csrf_refused(request, view):
                message = "A signed-in session's POST needs its CSRF token (X-CSRFToken)."
                return refused(403, ApiError.CSRF_FAILED, message)
            return view(request, user, *args, **kwargs)

        return endpoint

    return wrap


def _signed_in(request: HttpRequest) -> bool:
    """Whether the session's user is the request's (CSRF protects exactly these)."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated)


def _csrf_refused(request: HttpRequest, view: Callable[..., Any]) -> bool:
    """Django's own CSRF check, as its middleware runs it (and logs a refusal)."""
    check = CsrfViewMiddleware(lambda _request: HttpResponse())
    check.process_request(request)
    return check.process_view(request, view, (), {}) is not None


def _base_url(request: HttpRequest) -> str:
    return str(abp_settings().PUBLIC_BASE_URL or request.build_absolute_uri("/"))


def _page_json(request: HttpRequest, user: AbstractBaseUser) -> dict[str, Any]:
    """A page of the user's jobs as the API answers it; BadFilter if the query is bad."""
    status = request.GET.get("status") or None
    limit_text = request.GET.get("limit") or str(user_jobs.PAGE_SIZE)
    if not limit_text.isdigit():
        raise user_jobs.BadFilter(f"limit must be a whole number up to {user_jobs.MAX_PAGE_SIZE}.")
    page = user_jobs.list_jobs(
        user, status=status, limit=int(limit_text), cursor=request.GET.get("cursor") or None
    )
    base_url = _base_url(request)
    following = None
    if page.next_cursor is not None:
        query = request.GET.copy()
        query["cursor"] = page.next_cursor
        following = f"{reverse('abp-your-jobs-json')}?{query.urlencode()}"
    return {
        "jobs": [job_json(job, base_url=base_url) for job in page.jobs],
        "nextCursor": page.next_cursor,
        "next": following,
    }


@api("GET")
def jobs_list(request: HttpRequest, user: AbstractBaseUser) -> HttpResponse:
    """`GET /abp/jobs.json`: a page of the user's jobs, newest first."""
    try:
        return JsonResponse(_page_json(request, user))
    except user_jobs.BadFilter as bad:
        return refused(400, ApiError.INVALID_PARAMS, str(bad))


@api("GET")
def job_detail(request: HttpRequest, user: AbstractBaseUser, job_id: uuid.UUID) -> HttpResponse:
    """`GET /abp/jobs/<id>.json`: one of the user's jobs."""
    try:
        job = user_jobs.get_job(user, job_id)
    except user_jobs.JobNotFound:
        return refused(404, ApiError.NOT_FOUND, "No job of yours has this id.")
    return JsonResponse(job_json(job, base_url=_base_url(request)))


@api("POST")
def cancel(request: HttpRequest, user: AbstractBaseUser, job_id: uuid.UUID) -> HttpResponse:
    """`POST /abp/jobs/<id>/cancel`: cancel one of the user's jobs (source `user`)."""
    reason = _reason(request)
    if reason is None:
        message = 'reason must be text (JSON `{"reason": ...}` or a form field).'
        return refused(400, ApiError.INVALID_PARAMS, message)
    try:
        answer = user_jobs.cancel_job(user, job_id, reason=reason or DEFAULT_REASON)
    except user_jobs.JobNotFound:
        return refused(404, ApiError.NOT_FOUND, "No job of yours has this id.")
    return JsonResponse(
        {"id": str(answer.job_id), "cancelled": answer.cancelled, "status": answer.status}
    )


def _reason(request: HttpRequest) -> str | None:
    """The reason the caller gave ("" for none), or None if it cannot be read."""
    if request.content_type == "application/json" and request.body:
        try:
            body = json.loads(request.body)
        except ValueError:
            return None
        given = body.get("reason", "") if isinstance(body, dict) else None
    else:
        given = request.POST.get("reason", "")
    if not isinstance(given, str) or unstorable(given):
        return None
    return given.strip()


@never_cache
@login_required
@require_GET
def page(request: HttpRequest) -> HttpResponse:
    """`/abp/jobs/`: the signed-in user's jobs, live, each active one with a Cancel."""
    user = request.user
    assert isinstance(user, AbstractBaseUser)  # login_required let only a user through
    try:
        first = _page_json(request, user)
    except user_jobs.BadFilter:
        first = {"jobs": [], "nextCursor": None, "next": None}
    config = {
        "listUrl": reverse("abp-your-jobs-json"),
        "status": request.GET.get("status", ""),
        "cursor": request.GET.get("cursor", ""),
        "pollActiveMs": POLL_ACTIVE_MS,
        "pollIdleMs": POLL_IDLE_MS,
        "initial": first,
    }
    context = {
        "config": config,
        "statuses": list(user_jobs.STATUS_FILTERS),
        "username": user.get_username(),
    }
    return render(request, "abp/your_jobs.html", context)
