"""Every environment variable the settings read is documented in .env.example; some are read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

READS = re.compile(
    r"""(?:_env_\w+|os\.environ\.get|os\.environ\[)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
)


def test_env_example_lists_every_variable_settings_read() -> None:
    read = set(READS.findall((ROOT / "abpsite" / "settings.py").read_text()))
    documented = set(re.findall(r"^#([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    # The rest, one per key of settings.ABP and its siblings, are read by their models
    # (test_config_environment.py checks those).
    assert len(read) > 30
    assert sorted(read - documented) == []


def settings_under(**environment: str) -> dict[str, object]:
    """The scaling settings as abpsite.settings reads them under `environment`."""
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'hosts': s.CHANNEL_LAYERS['default']['CONFIG']['hosts'], "
        "'cursors': s.DATABASES['default'].get('DISABLE_SERVER_SIDE_CURSORS', False)}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "abpsite.settings", "DJANGO_ENV": "development"}
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.stack  # Django started in a process of its own
def test_channel_layer_shards_and_pgbouncer_come_from_the_environment() -> None:
    sharded = settings_under(
        CHANNEL_LAYER_REDIS_URL="redis://a:6379/0, redis://b:6379/0",
        DATABASE_URL="postgres://abp@db:5432/abp",
        DATABASE_PGBOUNCER="1",
    )
    assert sharded == {"hosts": ["redis://a:6379/0", "redis://b:6379/0"], "cursors": True}
    plain = settings_under(REDIS_URL="redis://r:6379/0", DATABASE_URL="postgres://abp@db/abp")
    assert plain == {"hosts": ["redis://r:6379/0"], "cursors": False}
