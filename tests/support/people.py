"""Django users for the tests: fresh ones, with the permissions a test names."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission


def person(
    *permissions: str, active: bool = True, password: str | None = None, prefix: str = "u"
) -> Any:
    """A new user with these permissions ("app_label.codename"), active unless not."""
    made = get_user_model().objects.create_user(
        username=f"{prefix}-{uuid.uuid4().hex[:10]}", password=password, is_active=active
    )
    for name in permissions:
        label, codename = name.split(".")
        made.user_permissions.add(
            Permission.objects.get(content_type__app_label=label, codename=codename)
        )
    return made
