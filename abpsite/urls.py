"""Root URLs."""

from django.contrib import admin
from django.urls import include, path

# /abp/uploads is served in front of Django (abpsite/asgi.py, capabilities/web/uploads.py).
urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("capabilities.web.urls")),
]
