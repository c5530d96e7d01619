"""The app's HTTP routes: one line in a host's urls.py, `path("", include("capabilities.urls"))`.

At the root, because agents look for `/abp.json` there. `/` and the other pages are the
host's: `{% load abp %}{% abp_runtime %}` gives them `window.abp`. `/mcp` and `/abp/uploads`
are served in front of Django, and the WebSockets beside it (capabilities/asgi.py).
The admin is the host's: its `admin.site.urls` shows the app's jobs, sessions and keys.
"""

from django.urls import path

from capabilities.web import downloads, health, metrics, views, your_keys

urlpatterns = [
    path("abp.json", views.manifest, name="abp-manifest"),
    path("abp/embed/", views.embed, name="abp-embed"),
    path("abp/page-token/", views.page_token, name="abp-page-token"),
    path("abp/files/<str:token>/<str:filename>", downloads.download, name="abp-download"),
    # A signed-in user's own agent keys (docs/security.md#keys-a-user-owns).
    path("abp/keys/", your_keys.your_keys, name="abp-your-keys"),
    path("abp/keys/<uuid:key_id>/revoke/", your_keys.revoke, name="abp-revoke-key"),
    # Operators': liveness, readiness, Prometheus (docs/operating.md#health-and-metrics).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
]
