"""The app's settings: a host's partial ABP over the typed defaults, and Celery's part of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, _state
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from pydantic import ValidationError

from capabilities import celery_setup, conf
from capabilities.conf import abp_settings
from capabilities.config.schema import AbpSettings, Queues


def test_a_partial_abp_is_read_over_the_defaults_and_restored_after() -> None:
    before = abp_settings()
    with override_settings(ABP={"MAX_TIMEOUT_MS": 5000, "QUEUES": {"heavy": "reports"}}):
        assert abp_settings().MAX_TIMEOUT_MS == 5000
        # The other queue keeps its default.
        assert Queues(small="abp.small", heavy="reports") == abp_settings().QUEUES
        assert abp_settings().CALLS_PER_MINUTE == AbpSettings().CALLS_PER_MINUTE
    assert abp_settings() == before


def test_a_bad_value_is_an_error_naming_each_bad_key() -> None:
    bad = {"MAX_TIMEOUT_MS": "soon", "QUEUES": {"heavy": ""}, "LOCAL_LANE_PROCESSES": -1}
    with override_settings(ABP=bad), pytest.raises(ImproperlyConfigured) as refused:
        abp_settings()
    assert str(refused.value).splitlines() == [
        "settings.ABP['MAX_TIMEOUT_MS']: Input should be a valid integer, unable to parse"
        " string as an integer (got 'soon').",
        "settings.ABP['LOCAL_LANE_PROCESSES']: Input should be greater than or equal to 0"
        " (got -1).",
        "settings.ABP['QUEUES']['heavy']: String should have at least 1 character (got '').",
    ]


def test_the_app_refuses_to_start_with_a_bad_value() -> None:
    redirect_from_disk = override_settings(ABP_STORAGE={"DOWNLOAD_REDIRECT": True})
    with redirect_from_disk, pytest.raises(ImproperlyConfigured, match=r"REDIRECT'\]: needs"):
        conf.install()
    conf.install()


def test_the_settings_are_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        abp_settings().MAX_TIMEOUT_MS = 1


def test_a_key_the_app_does_not_know_is_a_warning() -> None:
    with override_settings(ABP={"MAX_TIMEOUT": 5}, ABP_METRICS={"TOKENS": "x"}):
        found = conf.unknown_keys()
    assert [(message.id, message.msg) for message in found] == [
        ("capabilities.W010", "settings.ABP has a key this app does not read: 'MAX_TIMEOUT'."),
        ("capabilities.W010", "settings.ABP_METRICS has a key this app does not read: 'TOKENS'."),
    ]
    assert conf.unknown_keys() == []


def test_a_host_without_a_channel_layer_gets_the_apps_on_its_redis() -> None:
    assert conf.channel_layers("redis://redis.internal:6379/2") == {
        "default": {
            "BACKEND": "capabilities.channel_layer.RetryingPubSubChannelLayer",
            "CONFIG": {"hosts": ["redis://redis.internal:6379/2"]},
        }
    }


@pytest.fixture(autouse=True)
def celery_default_kept() -> Iterator[None]:
    """`configure` makes its app Celery's default: the suite's own comes back after."""
    before = _state.default_app  # type: ignore[attr-defined]  # not in celery-types
    yield
    _state.set_default_app(before)


def configured(**host_settings: Any) -> Celery:
    app = Celery("host", set_as_current=False)
    app.config_from_object(host_settings)
    celery_setup.configure(app)
    return app


def test_configure_adds_the_worker_tasks_and_beat_entries_on_the_small_queue() -> None:
    app = configured(imports=("host.tasks",))
    assert app.conf.imports == ("host.tasks", celery_setup.TASKS_MODULE)
    schedule = app.conf.beat_schedule
    small = abp_settings().QUEUES.small
    assert schedule["abp-reap"] == {
        "task": "abp.reap",
        "schedule": abp_settings().REAPER_INTERVAL_SECONDS,
        "options": {"queue": small},
    }
    assert schedule["abp-clean-up"]["options"] == {"queue": small}


def test_a_host_entry_of_the_same_name_wins_and_its_own_entries_stay() -> None:
    mine = {"task": "abp.reap", "schedule": 9.0}
    ours = {"task": "host.report", "schedule": 60.0}
    app = configured(beat_schedule={"abp-reap": mine, "host-report": ours})
    assert app.conf.beat_schedule["abp-reap"] == mine
    assert app.conf.beat_schedule["host-report"] == ours
    assert "abp-clean-up" in app.conf.beat_schedule


def test_configure_works_on_an_app_already_configured() -> None:
    app = Celery("host", set_as_current=False)
    app.config_from_object({})
    assert app.conf.imports == ()  # reading it loads the configuration
    celery_setup.configure(app)
    assert celery_setup.TASKS_MODULE in app.conf.imports
