"""HTTP routes of the ABP app."""

from django.urls import path

from capabilities import views

urlpatterns = [
    path("", views.index, name="index"),
    path("abp.json", views.manifest, name="abp-manifest"),
]
