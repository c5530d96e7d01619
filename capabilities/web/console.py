"""`/abp/console/`: a form for every capability the signed-in user may call, run in the page.

What FastAPI's `/docs` is to an API: a developer sees a new capability work before
writing any client. The page draws nothing from the registry itself: its script
(static/abp/console.js) opens a session with `window.abp`, whose page token is bound
to the signed-in user, and shows the capabilities that session offers, which are the
ones the user may call (their permissions, as for any of their agents).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from capabilities.calls.app_info import app_info


@require_GET
# Never stored by a cache: the page carries a page token bound to this user.
@never_cache
@login_required
def console(request: HttpRequest) -> HttpResponse:
    """The console page, for any signed-in user (to settings.LOGIN_URL otherwise)."""
    return render(request, "abp/console.html", {"app": app_info()})
