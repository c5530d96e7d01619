"""HTTP routes of the ABP app."""

from django.urls import path

from capabilities.web import downloads, views

urlpatterns = [
    path("", views.index, name="index"),
    path("abp.json", views.manifest, name="abp-manifest"),
    path("abp/embed/", views.embed, name="abp-embed"),
    path("abp/demo/", views.demo, name="abp-demo"),
    path("abp/page-token/", views.page_token, name="abp-page-token"),
    path("abp/files/<str:token>/<str:filename>", downloads.download, name="abp-download"),
]
