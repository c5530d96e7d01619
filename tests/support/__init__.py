"""Test helpers shared by the unit tests: fakes at the seams, nothing else."""

from __future__ import annotations

import os


def ensure_django() -> None:
    """Configure Django from `abpsite.settings` unless a conftest already did."""
    import django  # noqa: PLC0415 - only the tests that need settings pay for it
    from django.conf import settings  # noqa: PLC0415

    if not settings.configured:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "abpsite.settings")
    django.setup()
