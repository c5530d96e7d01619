"""`/abp/keys/`, "Your keys": a signed-in user makes, lists and revokes their own agent keys.

A new key's plaintext is on the response to the POST that made it, and nowhere else:
not in a redirect's URL, the session or a message, and the page is never cached.
Revoking is the admin's code (`key_revocation.revoke`): the key's calls are cancelled
and its connections closed. Another user's key is a 404, as one that does not exist.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from capabilities.access import owned_keys
from capabilities.access.agent_keys import KEY_START
from capabilities.conf import abp_settings
from capabilities.endings import key_revocation
from capabilities.models import AgentKey
from capabilities.web.key_forms import NewKeyForm


def _signed_in(request: HttpRequest) -> AbstractBaseUser:
    """The request's user (`login_required` let only a signed-in one through)."""
    user = request.user
    assert isinstance(user, AbstractBaseUser)
    return user


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def your_keys(request: HttpRequest) -> HttpResponse:
    """GET: the user's keys and the form. POST: a new key, shown on this response alone."""
    user = _signed_in(request)
    offered = owned_keys.callable_by(user)
    form = NewKeyForm(request.POST if request.method == "POST" else None, offered=offered)
    created: tuple[AgentKey, str] | None = None
    if form.is_bound and form.is_valid():
        try:
            created = owned_keys.create_own_key(
                user, name=form.cleaned_data["name"], scopes=form.chosen_scopes()
            )
        except owned_keys.KeyRefused as refused:
            form.add_error(None, refused.message)
        else:
            form = NewKeyForm(offered=offered)
    context = {
        "form": form,
        "keys": owned_keys.keys_of(user),
        "created": created[0] if created else None,
        "plaintext": created[1] if created else None,
        "key_start": KEY_START,
        "max_keys": abp_settings().MAX_KEYS_PER_USER,
    }
    return render(request, "abp/your_keys.html", context)


@never_cache
@login_required
@require_POST
def revoke(request: HttpRequest, key_id: uuid.UUID) -> HttpResponse:
    """Revoke one of the user's own keys: its calls are cancelled, its connections closed."""
    mine = owned_keys.keys_of(_signed_in(request)).filter(pk=key_id)
    key = mine.first()
    if key is None:
        raise Http404("No such key of yours.")
    if key_revocation.revoke(mine):
        note = f"Revoked {key.name}: its connections were closed, its calls cancelled."
    else:
        note = f"{key.name} was revoked already."
    # fail_silently: a host without the messages app still revokes.
    messages.success(request, note, fail_silently=True)
    return redirect("abp-your-keys")
