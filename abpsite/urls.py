"""Root URLs: the admin, the demo's own pages, and the app's routes (capabilities/urls.py)."""

from django.contrib import admin
from django.urls import include, path

from abpsite import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Sign-in for people: "Your jobs", the console and OAuth consent need a user.
    path("accounts/", include("django.contrib.auth.urls")),
    # Before the app's routes: a host's own pages come first.
    path("", views.index, name="index"),
    path("abp/demo/", views.demo, name="abp-demo"),
    path("", include("capabilities.urls")),
]
