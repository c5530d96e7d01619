"""What production settings refuse: every unsafe value, found at once.

Pure: settings.py passes the values in, and raises ImproperlyConfigured with the
whole list, so an operator fixes them in one go instead of one restart per problem.
"""

from __future__ import annotations

from collections.abc import Sequence

from capabilities.access.origins import BadOrigin, normalize_origin

# Django's own `check --deploy` (W009) wants at least this much of a SECRET_KEY.
MIN_SECRET_KEY_LENGTH = 50
DEVELOPMENT_SECRET_KEY = "django-insecure-development-only-key"


def production_problems(
    *,
    debug: bool,
    secret_key: str,
    allow_anonymous: bool,
    allowed_origins: Sequence[str],
    embed_allowed_origins: Sequence[str],
    allowed_hosts: list[str],
) -> list[str]:
    """Each unsafe value of a production configuration, as a sentence naming its variable."""
    problems: list[str] = []
    if debug:
        problems.append("DJANGO_DEBUG is on (development only: set DJANGO_ENV=development).")
    if not secret_key:
        problems.append("DJANGO_SECRET_KEY is not set.")
    elif (
        secret_key == DEVELOPMENT_SECRET_KEY
        or secret_key.startswith("django-insecure")
        or len(secret_key) < MIN_SECRET_KEY_LENGTH
        or len(set(secret_key)) < 5
    ):
        problems.append(
            f"DJANGO_SECRET_KEY is too weak (at least {MIN_SECRET_KEY_LENGTH} random characters;"
            ' python -c "import secrets; print(secrets.token_urlsafe(50))").'
        )
    if allow_anonymous:
        problems.append("ABP_ALLOW_ANONYMOUS is on: every WebSocket client would be let in.")
    if not allowed_origins:
        problems.append(
            "ABP_ALLOWED_ORIGINS is empty: name the origin(s) your pages are served from "
            "(e.g. https://jobs.example.com)."
        )
    for variable, values in (
        ("ABP_ALLOWED_ORIGINS", allowed_origins),
        ("ABP_EMBED_ALLOWED_ORIGINS", embed_allowed_origins),
    ):
        for value in values:
            try:
                normalize_origin(value)
            except BadOrigin as error:
                problems.append(f"{variable}: {error}")
    if "*" in allowed_hosts:
        problems.append("DJANGO_ALLOWED_HOSTS contains `*`: name the host names.")
    return problems
