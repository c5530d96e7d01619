"""HTTP routes of the ABP app."""

from django.urls import path

from capabilities.web import downloads, health, metrics, views

urlpatterns = [
    path("", views.index, name="index"),
    path("abp.json", views.manifest, name="abp-manifest"),
    path("abp/embed/", views.embed, name="abp-embed"),
    path("abp/demo/", views.demo, name="abp-demo"),
    path("abp/page-token/", views.page_token, name="abp-page-token"),
    path("abp/files/<str:token>/<str:filename>", downloads.download, name="abp-download"),
    # Operators': liveness, readiness, Prometheus (docs/operating.md#health-and-metrics).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
]
