"""Root URLs: the admin, and the app's routes (capabilities/urls.py)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("capabilities.urls")),
]
