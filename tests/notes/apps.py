"""The docs' `ctx.user` example app."""

from django.apps import AppConfig


class NotesConfig(AppConfig):
    """Its label is `notes`, as the example's permission `notes.view_note` says."""

    name = "tests.notes"
    label = "notes"
    default_auto_field = "django.db.models.BigAutoField"
