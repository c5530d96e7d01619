"""Production settings refuse unsafe values at start; development ones start as they are.

Each case runs Django's `check --deploy` in a subprocess with its own environment,
as an operator's `manage.py` or Daphne would load the settings. The web command
(`scripts/serve web`, which the Procfile, the Dockerfile and docker-compose.yml run) runs
the checks before Daphne: tests/stack/test_production_stack.py checks it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.core.management import call_command
from django.test import override_settings

from abpsite.safety import production_problems
from capabilities import checks
from tests.support.paths import ROOT

# Each test starts Django in a process of its own.
pytestmark = pytest.mark.stack

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


@pytest.fixture
def development_password() -> Iterator[str]:
    """A development password of this test's own (the suite's DB has other accounts)."""
    password = f"dev-{uuid.uuid4().hex}"
    yield password
    get_user_model().objects.filter(username__startswith="devpw-").delete()


def account(username: str, encoded: str, **flags: bool) -> AbstractBaseUser:
    """An account with an already hashed password (hashing costs ~0.4 s)."""
    user: AbstractBaseUser = get_user_model().objects.create(
        username=username, password=encoded, **flags
    )
    return user


@pytest.mark.usefixtures("database")
def test_accounts_with_the_development_password_are_refused_in_production(
    development_password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The suite's DB holds other tests' superusers: look at all of them here.
    monkeypatch.setattr(checks, "MAX_SUPERUSERS_CHECKED", 1000)
    encoded = make_password(development_password)
    account("devpw-named", encoded)  # the development superuser's name: checked as it is
    account("devpw-root", encoded, is_superuser=True, is_staff=True)
    account("devpw-inactive", encoded, is_superuser=True, is_active=False)
    account("devpw-staff", encoded, is_staff=True)  # not a superuser: not checked
    account("devpw-changed", make_password("another one"), is_superuser=True)
    with override_settings(
        DEV_SUPERUSER_USERNAME="devpw-named", DEV_SUPERUSER_PASSWORD=development_password
    ):
        found = checks.development_password_in_use()
        assert {error.id for error in found} == {"capabilities.E001"}
        assert sorted(error.msg.split("'")[1] for error in found) == ["devpw-named", "devpw-root"]
        assert "manage.py changepassword devpw-root" in str(found[1].hint)
        with override_settings(DEVELOPMENT=True):
            assert checks.development_password_in_use() == []


@pytest.mark.usefixtures("database")
def test_manage_py_check_refuses_while_the_development_password_logs_in(
    development_password: str,
) -> None:
    user = account("devpw-admin", make_password(development_password), is_superuser=True)
    environment = {
        # The suite's own database, migrated, with the account in it.
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "DJANGO_DEV_SUPERUSER_USERNAME": "devpw-admin",
        "DJANGO_DEV_SUPERUSER_PASSWORD": development_password,
    }
    refused = run_check(**environment)
    assert refused.returncode != 0
    assert "capabilities.E001" in refused.stderr
    assert "'devpw-admin' logs in with the development password" in refused.stderr
    user.set_password(f"changed-{uuid.uuid4().hex}")
    user.save()
    checked = run_check(**environment)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.usefixtures("database")
def test_make_run_makes_no_development_superuser_outside_debug() -> None:
    # `make run` runs the command under the served processes' environment (.env wins);
    # with DEBUG off it says so, creates nobody, and lets the demo start.
    out = io.StringIO()
    with override_settings(DEV_SUPERUSER_USERNAME="devpw-make-run"):
        call_command("ensure_dev_superuser", "--skip-unless-debug", stdout=out)
    assert out.getvalue() == "DEBUG is off: no development superuser.\n"
    assert not get_user_model().objects.filter(username="devpw-make-run").exists()
