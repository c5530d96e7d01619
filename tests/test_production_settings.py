"""Production settings refuse unsafe values at start; development ones start as they are.

Each case runs Django's `check --deploy` in a subprocess with its own environment,
as an operator's `manage.py` or Daphne would load the settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from abpsite.safety import production_problems

ROOT = Path(__file__).resolve().parent.parent
STRONG_KEY = "k3Jx9_Qw-" + "a1b2c3d4e5" * 5
SAFE = {
    "DJANGO_ENV": "production",
    "DJANGO_SECRET_KEY": STRONG_KEY,
    "ABP_ALLOWED_ORIGINS": "https://jobs.example.com",
    "DJANGO_ALLOWED_HOSTS": "jobs.example.com",
    "DATABASE_URL": "sqlite:///:memory:",
}


def run_check(**environment: str | None) -> subprocess.CompletedProcess[str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DJANGO_", "ABP_"))
    }
    env.update(
        {name: value for name, value in {**SAFE, **environment}.items() if value is not None}
    )
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "ERROR"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_safe_production_settings_start_with_security_defaults_on() -> None:
    checked = run_check()
    assert checked.returncode == 0, checked.stderr
    output = checked.stdout + checked.stderr
    # Django's own deployment checks find nothing about cookies, DEBUG, the key or
    # framing (W004/W008 about HSTS and the HTTPS redirect are for the TLS proxy).
    for warning in ("W009", "W012", "W016", "W018", "W019", "W020", "W022"):
        assert f"security.{warning}" not in output


@pytest.mark.parametrize(
    ("environment", "complaint"),
    [
        ({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY is not set"),
        ({"DJANGO_SECRET_KEY": "short"}, "DJANGO_SECRET_KEY is too weak"),
        ({"DJANGO_SECRET_KEY": "django-insecure-" + "x" * 60}, "too weak"),
        ({"DJANGO_DEBUG": "1"}, "DJANGO_DEBUG is on"),
        ({"ABP_ALLOW_ANONYMOUS": "1"}, "ABP_ALLOW_ANONYMOUS is on"),
        ({"ABP_ALLOWED_ORIGINS": ""}, "ABP_ALLOWED_ORIGINS is empty"),
        ({"ABP_ALLOWED_ORIGINS": "*"}, "ABP_ALLOWED_ORIGINS: '*' is not an origin"),
        ({"ABP_EMBED_ALLOWED_ORIGINS": "null"}, "ABP_EMBED_ALLOWED_ORIGINS: 'null'"),
        ({"DJANGO_ALLOWED_HOSTS": "*"}, "DJANGO_ALLOWED_HOSTS contains `*`"),
        ({"DJANGO_ENV": "staging"}, "DJANGO_ENV must be"),
    ],
)
def test_unsafe_production_settings_refuse_to_start(
    environment: dict[str, str | None], complaint: str
) -> None:
    checked = run_check(**environment)
    assert checked.returncode != 0
    assert "ImproperlyConfigured" in checked.stderr
    assert complaint in checked.stderr


def test_every_problem_is_reported_at_once() -> None:
    checked = run_check(DJANGO_DEBUG="1", ABP_ALLOW_ANONYMOUS="1", ABP_ALLOWED_ORIGINS="")
    assert checked.returncode != 0
    for complaint in ("DJANGO_DEBUG", "ABP_ALLOW_ANONYMOUS", "ABP_ALLOWED_ORIGINS is empty"):
        assert complaint in checked.stderr


def test_development_starts_without_a_key_and_lets_anonymous_agents_in() -> None:
    checked = run_check(DJANGO_ENV="development", DJANGO_SECRET_KEY=None, ABP_ALLOWED_ORIGINS=None)
    assert checked.returncode == 0, checked.stderr
    assert "ABP_ALLOW_ANONYMOUS is on" in checked.stderr  # the warning at start


def test_production_problems_is_empty_for_safe_values() -> None:
    assert (
        production_problems(
            debug=False,
            secret_key=STRONG_KEY,
            allow_anonymous=False,
            allowed_origins=["https://jobs.example.com", "http://127.0.0.1:*"],
            embed_allowed_origins=[],
            allowed_hosts=["jobs.example.com"],
        )
        == []
    )
