"""The notes of docs/your-capabilities.md's `ctx.user` example: rows a user owns."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Note(models.Model):
    """A note of one user's."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    title = models.CharField(max_length=200)
    # Declared for mypy, whose settings (abpsite's) do not install this test app.
    objects: models.Manager[Note] = models.Manager()

    def __str__(self) -> str:
        return self.title
