"""`run_capability` says what is missing instead of "Unknown capability"."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.exceptions import AppRegistryNotReady

from capabilities.testing import run_capability
from capabilities.work import registry
from capabilities.work.context import CapabilityError


def test_before_django_is_set_up_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apps, "ready", False)
    with pytest.raises(AppRegistryNotReady, match=r"needs Django set up.*pytest-django"):
        run_capability("reports.squares", {})


def test_a_built_in_without_its_extra_names_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "get", lambda name: None)
    with pytest.raises(CapabilityError, match=r'pip install "abp-jobs\[pdf\]"'):
        run_capability("export.pdf", {})
    with pytest.raises(CapabilityError, match=r"Unknown capability 'no.such'\.$"):
        run_capability("no.such", {})
