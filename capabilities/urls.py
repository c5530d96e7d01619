"""The app's HTTP routes: one line in a host's urls.py, `path("", include("capabilities.urls"))`.

At the root, because agents look for `/abp.json` there. `/` and the other pages are the
host's: `{% load abp %}{% abp_runtime %}` gives them `window.abp`. `/mcp` and `/abp/uploads`
are served in front of Django, and the WebSockets beside it (capabilities/asgi.py).
The admin is the host's: its `admin.site.urls` shows the app's jobs, sessions and keys.
"""

from django.urls import path

from capabilities.web import console, downloads, health, metrics, views, your_jobs, your_keys

urlpatterns = [
    path("abp.json", views.manifest, name="abp-manifest"),
    path("abp/embed/", views.embed, name="abp-embed"),
    path("abp/page-token/", views.page_token, name="abp-page-token"),
    path("abp/files/<str:token>/<str:filename>", downloads.download, name="abp-download"),
    path("abp/console/", console.console, name="abp-console"),
    # A signed-in user's own agent keys (docs/security.md#keys-a-user-owns).
    path("abp/keys/", your_keys.your_keys, name="abp-your-keys"),
    path("abp/keys/<uuid:key_id>/revoke/", your_keys.revoke, name="abp-revoke-key"),
    # "Your jobs": a signed-in user's own jobs, and its JSON API (docs/your-jobs.md).
    # The API's paths have no slash to append: no 301, which would turn a POST into a GET.
    path("abp/jobs/", your_jobs.page, name="abp-your-jobs"),
    path("abp/jobs.json", your_jobs.jobs_list, name="abp-your-jobs-json"),
    path("abp/jobs/<uuid:job_id>.json", your_jobs.job_detail, name="abp-your-job-json"),
    path("abp/jobs/<uuid:job_id>/cancel", your_jobs.cancel, name="abp-your-job-cancel"),
    # Operators': liveness, readiness, Prometheus (docs/operating.md#health-and-metrics).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
]
