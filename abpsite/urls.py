"""Root URLs: the admin, sign-in, the demo's home page, the app's routes (capabilities/urls.py)."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from abpsite import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Sign-in for people: "Your jobs", the console and OAuth consent need a user.
    path("accounts/", include("django.contrib.auth.urls")),
    # Before the app's routes: a host's own pages come first.
    path("", views.index, name="index"),
    # The demo's forms became the app's console; old links still land there.
    path("abp/demo/", RedirectView.as_view(pattern_name="abp-console"), name="abp-demo"),
    path("", include("capabilities.urls")),
    # OAuth 2.1 for MCP clients: the metadata documents and the endpoints (/o/...).
    path("", include("capabilities.oauth.urls")),
]
