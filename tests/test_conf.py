"""The app's settings: a host's partial ABP over the defaults, and Celery's part of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, _state
from django.conf import settings
from django.test import override_settings

from capabilities import celery_setup, conf


def test_the_demo_sets_every_key_the_app_has_a_default_for() -> None:
    assert set(settings.ABP) == set(conf.DEFAULTS)
    assert set(settings.ABP_METRICS) == set(conf.METRICS_DEFAULTS)
    assert set(settings.ABP_STORAGE) == set(conf.STORAGE_DEFAULTS)


def test_a_partial_abp_is_merged_over_the_defaults_and_restored_after() -> None:
    before = settings.ABP
    with override_settings(ABP={"MAX_TIMEOUT_MS": 5000, "QUEUES": {"heavy": "reports"}}):
        assert settings.ABP["MAX_TIMEOUT_MS"] == 5000
        # One level deeper for dicts: the other queue keeps its default.
        assert settings.ABP["QUEUES"] == {"small": "abp.small", "heavy": "reports"}
        assert settings.ABP["CALLS_PER_MINUTE"] == conf.DEFAULTS["CALLS_PER_MINUTE"]
    assert settings.ABP is before


def test_the_defaults_are_never_changed_by_a_merge() -> None:
    with override_settings(ABP={"LOCAL_LANE_CAPABILITIES": ["reports.squares"]}):
        settings.ABP["TRUSTED_PROXIES"].append("10.0.0.1")
    assert conf.DEFAULTS["TRUSTED_PROXIES"] == []
    assert conf.DEFAULTS["LOCAL_LANE_CAPABILITIES"] == ["convert.markdownToHtml"]


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
    small = settings.ABP["QUEUES"]["small"]
    assert schedule["abp-reap"] == {
        "task": "abp.reap",
        "schedule": float(settings.ABP["REAPER_INTERVAL_SECONDS"]),
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
