"""The authorization server's routes: `path("", include("capabilities.oauth.urls"))`.

At the root, because the metadata documents must be there: RFC 8414's at
`/.well-known/oauth-authorization-server`, so the issuer is the site's origin (the
one `iss` the toolkit derives, RFC 9207), and RFC 9728's at
`/.well-known/oauth-protected-resource/mcp`. The endpoints live under `/o/`, each
with and without its trailing slash: a client that drops it must not meet an
APPEND_SLASH redirect (a 301 turns its POST into a GET).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpResponseBase
from django.urls import URLPattern, include, path, re_path
from oauth2_provider import views as toolkit

from capabilities.oauth import views


def _endpoint(route: str, view: Callable[..., HttpResponseBase], name: str) -> URLPattern:
    """`o/<route>`, with or without a trailing slash (the metadata names it without)."""
    return re_path(rf"^o/{route}/?$", view, name=name)


patterns = [
    path(
        ".well-known/oauth-authorization-server",
        toolkit.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    path(
        ".well-known/oauth-protected-resource",
        toolkit.OAuthProtectedResourceMetadataView.as_view(),
        name="oauth-resource-metadata",
    ),
    path(
        ".well-known/oauth-protected-resource/<path:resource_path>",
        toolkit.OAuthProtectedResourceMetadataView.as_view(),
        name="oauth-resource-metadata-path",
    ),
    _endpoint("authorize", views.ConsentView.as_view(), "authorize"),
    _endpoint("token", toolkit.TokenView.as_view(), "token"),
    _endpoint("revoke_token", views.ClosingRevokeTokenView.as_view(), "revoke-token"),
    _endpoint("introspect", toolkit.IntrospectTokenView.as_view(), "introspect"),
    _endpoint("register", views.BoundedRegistrationView.as_view(), "dcr-register"),
    path(
        "o/register/<str:client_id>/",
        toolkit.DynamicClientRegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
    # The user's own grants: list and revoke them (revoking closes their sessions).
    path(
        "o/authorized_tokens/",
        toolkit.AuthorizedTokensListView.as_view(),
        name="authorized-token-list",
    ),
    path(
        "o/authorized_tokens/<slug:pk>/delete/",
        views.ClosingAuthorizedTokenDeleteView.as_view(),
        name="authorized-token-delete",
    ),
]

urlpatterns = [path("", include((patterns, "oauth2_provider")))]
