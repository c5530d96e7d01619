"""The toolkit's views, as MCP clients meet them: bounded registration, our consent page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from oauth2_provider.settings import oauth2_settings
from oauth2_provider.views import (
    AuthorizationView,
    AuthorizedTokenDeleteView,
    DynamicClientRegistrationView,
    RevokeTokenView,
)

from capabilities.access import rate_limits
from capabilities.access.credentials import client_address_of
from capabilities.oauth import registration, revocation

# Registrations per client address per minute: one per connection is what the
# agent apps do, and a flood fills the table.
REGISTRATIONS_PER_MINUTE = 10


@method_decorator(csrf_exempt, name="dispatch")
class BoundedRegistrationView(DynamicClientRegistrationView):  # type: ignore[misc]
    """Open Dynamic Client Registration, within bounds and a rate per address."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        address = client_address_of(request.scope) if hasattr(request, "scope") else ""
        address = address or str(request.META.get("REMOTE_ADDR", ""))
        if not rate_limits.take(f"oauth-register:{address}", REGISTRATIONS_PER_MINUTE):
            return _error("slow_down", "Too many registrations from this address; wait.", 429)
        schemes = tuple(
            scheme
            for scheme in oauth2_settings.ALLOWED_REDIRECT_URI_SCHEMES
            if scheme not in ("http", "https")
        )
        try:
            registration.check(request.body, schemes)
        except registration.RegistrationRefused as refused:
            return _error(refused.error, refused.description, 400)
        response: HttpResponse = super().post(request, *args, **kwargs)
        return response


def _error(error: str, description: str, status: int) -> JsonResponse:
    return JsonResponse({"error": error, "error_description": description}, status=status)


class ConsentView(AuthorizationView):  # type: ignore[misc]
    """The consent page: the client, where it sends you back, and what it may do."""

    template_name = "abp/oauth_consent.html"

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = super().get(request, *args, **kwargs)
        target = registration.redirect_origin(self._redirect_uri())
        if target:
            # The form's answer redirects to the client: a Content-Security-Policy
            # `form-action 'self'` (django-csp's, where the host has it) would stop
            # the browser there, so the consent page allows the client's origin too.
            response._csp_update = {"form-action": [target]}  # type: ignore[attr-defined]
        return response

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        context["redirect_host"] = registration.redirect_host(self._redirect_uri())
        return context

    def _redirect_uri(self) -> str:
        return str(getattr(self, "oauth2_data", {}).get("redirect_uri", "") or "")


class ClosingRevokeTokenView(RevokeTokenView):  # type: ignore[misc]
    """RFC 7009 revocation; the app's sessions for the user close with its last token."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        grant = revocation.grant_of(str(request.POST.get("token", "")))
        response: HttpResponse = super().post(request, *args, **kwargs)
        if response.status_code == 200 and grant is not None:
            revocation.withdraw_if_revoked(*grant)
        return response


class ClosingAuthorizedTokenDeleteView(AuthorizedTokenDeleteView):  # type: ignore[misc]
    """A user revokes an app's token; the app's sessions for them close with its last."""

    def form_valid(self, form: Any) -> HttpResponse:
        token = self.get_object()
        grant = (token.user_id, token.application.client_id if token.application else "")
        response: HttpResponse = super().form_valid(form)
        revocation.withdraw_if_revoked(*grant)
        return response
