"""Logged-in Django test clients for the admin pages."""

from __future__ import annotations

import uuid

from django.contrib.auth import get_user_model
from django.test import Client


def client_for(*, staff: bool) -> Client:
    """A client logged in as a new superuser (staff) or a plain user."""
    users = get_user_model()
    name = f"user-{uuid.uuid4().hex[:8]}"
    if staff:
        user = users.objects.create_superuser(username=name, email="", password="x")
    else:
        user = users.objects.create_user(username=name, password="x")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client
