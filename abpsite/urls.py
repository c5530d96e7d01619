"""Root URLs."""

from django.contrib import admin
from django.urls import include, path

from capabilities.web import uploads

urlpatterns = [
    path("admin/", admin.site.urls),
    # Our extension to ABP: raw bytes a call then names (docs/uploads.md).
    path("abp/uploads", uploads.upload, name="abp-upload"),
    path("", include("capabilities.web.urls")),
]
