"""The settings' types read from a deployment's environment, and `.env.example` naming every key."""

from __future__ import annotations

import re

import pytest

from capabilities.config.environment import from_environment
from capabilities.config.schema import AbpSettings, MetricsSettings, StorageSettings
from capabilities.work.registry import SizeLimit
from tests.support.paths import ROOT


def test_each_variable_is_read_by_its_keys_type() -> None:
    environ = {
        "ABP_MAX_TIMEOUT_MS": "5000",
        "ABP_RESUME_GRACE_SECONDS": "2.5",
        "ABP_ALLOW_ANONYMOUS": "Yes",
        "ABP_TRUSTED_PROXIES": "10.0.0.1, 10.1.0.0/16,",
        "ABP_CAPABILITY_QUEUES": "export.pdf=abp.pdf, broken, reports.squares=abp.small",
        "ABP_PUBLIC_BASE_URL": "",
        "ABP_MAX_PDF_PAGES": "",  # empty: the default holds
        "ABP_QUEUES": "ignored",  # not a variable: ABP_SMALL_QUEUE and ABP_HEAVY_QUEUE are
        "OTHER_MAX_TIMEOUT_MS": "1",
    }
    assert from_environment(AbpSettings, environ, prefix="ABP_") == {
        "MAX_TIMEOUT_MS": 5000,
        "RESUME_GRACE_SECONDS": 2.5,
        "ALLOW_ANONYMOUS": True,
        "TRUSTED_PROXIES": ("10.0.0.1", "10.1.0.0/16"),
        "CAPABILITY_QUEUES": {"export.pdf": "abp.pdf", "reports.squares": "abp.small"},
        "PUBLIC_BASE_URL": "",
    }


def test_the_environment_goes_over_what_the_project_set_and_skips_what_it_reads_itself() -> None:
    environ = {"ABP_METRICS_WINDOW_SECONDS": "60", "ABP_METRICS_TOKEN": "t" * 32}
    under = {"ALLOWED_IPS": ["127.0.0.1"], "WINDOW_SECONDS": 30}
    found = from_environment(
        MetricsSettings, environ, prefix="ABP_METRICS_", under=under, skip={"TOKEN"}
    )
    assert found == {"ALLOWED_IPS": ("127.0.0.1",), "WINDOW_SECONDS": 60.0}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"ABP_MAX_TIMEOUT_MS": "soon"},
            "ABP_MAX_TIMEOUT_MS: Input should be a valid integer, unable to parse string as an"
            " integer (got 'soon').",
        ),
        (
            {"ABP_MAX_PDF_PAGES": "0"},
            "ABP_MAX_PDF_PAGES: Input should be greater than or equal to 1 (got '0').",
        ),
        (
            {"ABP_ALLOW_ANONYMOUS": "maybe"},
            "ABP_ALLOW_ANONYMOUS: Input should be a valid boolean, unable to interpret input"
            " (got 'maybe').",
        ),
        (
            {"ABP_TRUSTED_PROXIES": "10.0.0.1,*"},
            "ABP_TRUSTED_PROXIES: '*' is not an IP address or network.",
        ),
        (
            {"ABP_TRUSTED_PROXIES": "10.0.0.1/8"},
            "ABP_TRUSTED_PROXIES: '10.0.0.1/8' is not an IP address or network.",
        ),
    ],
)
def test_a_value_its_type_refuses_is_an_error_naming_the_variable(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_environment(AbpSettings, environ, prefix="ABP_")


def test_a_redirect_needs_a_store_that_signs_urls() -> None:
    environ = {"ABP_DOWNLOAD_REDIRECT": "on"}
    with pytest.raises(ValueError, match="ABP_DOWNLOAD_REDIRECT: needs a store that signs"):
        from_environment(StorageSettings, environ, prefix="ABP_")
    s3 = from_environment(StorageSettings, environ, prefix="ABP_", under={"BACKEND": "s3"})
    assert s3 == {"BACKEND": "s3", "DOWNLOAD_REDIRECT": True}


def test_uploads_follow_the_image_limit_unless_set() -> None:
    assert AbpSettings(MAX_IMAGE_BYTES=1000).MAX_UPLOAD_BYTES == 1000
    assert AbpSettings(MAX_IMAGE_BYTES=1000, MAX_UPLOAD_BYTES=5).MAX_UPLOAD_BYTES == 5


def test_env_example_names_the_variable_of_every_key() -> None:
    named = set(re.findall(r"^#?\s*(ABP_[A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    expected = {f"ABP_{key}" for key in AbpSettings.model_fields if key != "QUEUES"}
    expected |= {"ABP_SMALL_QUEUE", "ABP_HEAVY_QUEUE"}
    expected |= {f"ABP_METRICS_{key}" for key in MetricsSettings.model_fields}
    expected |= {f"ABP_{key}" for key in StorageSettings.model_fields if key != "BACKEND"}
    expected |= {"ABP_STORAGE_BACKEND"}
    assert expected - named == set()


def test_a_capability_limit_must_name_an_integer_key() -> None:
    assert SizeLimit(path=("html",), setting="MAX_HTML_BYTES").setting == "MAX_HTML_BYTES"
    with pytest.raises(TypeError, match=r"'MAX_HTML' is not an integer key of settings\.ABP"):
        SizeLimit(path=("html",), setting="MAX_HTML")
    with pytest.raises(TypeError, match="'APP_NAME' is not an integer key"):
        SizeLimit(path=("html",), setting="APP_NAME")
