"""The pages and files the browser path is made of, checked over HTTP (no browser)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message

import pytest
from django.conf import settings
from django.test import override_settings

from capabilities.web.views import embed_allowed_origins
from tests.browser.conftest import ParentSite
from tests.support.stack import Stack


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, Message, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_embed_page_may_be_framed_by_allowed_origins_only(
    stack: Stack, parent_site: ParentSite
) -> None:
    status, headers, body = fetch(f"{stack.http_url}/abp/embed/")
    assert status == 200
    assert "X-Frame-Options" not in headers
    directives = headers["Content-Security-Policy"].split(";")
    policy = dict(directive.strip().split(" ", 1) for directive in directives)
    assert policy["frame-ancestors"] == f"'self' {parent_site.allowed}"
    assert policy["script-src"] == "'self'"
    assert policy["default-src"] == "'self'"
    assert policy["connect-src"].split()[0] == "'self'"
    assert policy["form-action"] == "'none'"
    match = re.search(rb'<script id="abp-embed-config" type="application/json">(.*?)<', body)
    assert match is not None
    config = json.loads(match.group(1))
    assert config["allowedOrigins"] == [parent_site.allowed]
    assert config["maxFrameBytes"] == 1024 * 1024
    assert config["endpoint"] == "/abp/ws"
    # The bridge's credential: a page token, and where to renew it.
    assert isinstance(config["token"], str)
    assert config["token"]
    assert config["tokenUrl"] == "/abp/page-token/"
    assert config["tokenMaxAgeSeconds"] == 600
    assert b'rel="abp-manifest" href="/abp.json"' in body
    # Every other page keeps Django's DENY.
    for path in ("/", "/abp/console/"):
        assert fetch(f"{stack.http_url}{path}")[1]["X-Frame-Options"] == "DENY"


def test_page_token_url_gives_a_fresh_token_never_cached(stack: Stack) -> None:
    status, headers, body = fetch(f"{stack.http_url}/abp/page-token/")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert "no-store" in headers["Cache-Control"]
    answer = json.loads(body)
    assert set(answer) == {"token", "maxAgeSeconds"}
    assert answer["maxAgeSeconds"] == 600
    assert answer["token"] != json.loads(fetch(f"{stack.http_url}/abp/page-token/")[2])["token"]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def location(url: str) -> tuple[int, str]:
    """The status and Location of a redirect, not followed."""
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location", "")


def test_the_demo_is_the_console_for_signed_in_people(stack: Stack) -> None:
    assert location(f"{stack.http_url}/abp/demo/") == (302, "/abp/console/")
    assert location(f"{stack.http_url}/abp/console/") == (
        302,
        "/accounts/login/?next=/abp/console/",
    )
    assert b'href="/abp/console/"' in fetch(f"{stack.http_url}/")[2]


@pytest.mark.parametrize(
    "name",
    [
        "runtime.js",
        "client.js",
        "page_token.js",
        "wire.js",
        "bridge.js",
        "uploads.js",
        "console.js",
        "console_form.js",
        "console_schema.js",
    ],
)
def test_browser_modules_are_served_as_javascript_to_any_origin(stack: Stack, name: str) -> None:
    url = f"{stack.http_url}/static/abp/{name}"
    status, headers, body = fetch(url)
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "text/javascript"
    assert "utf-8" in headers["Content-Type"]
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert headers["Cache-Control"] == "no-cache"
    assert body.startswith(b"// @ts-check")
    assert fetch(url, **{"If-Modified-Since": headers["Last-Modified"]})[0] == 304
    assert fetch(url, method="HEAD")[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "static/abp/missing.js",
        "static/abp/../../abpsite/settings.py",
        "static/abp/",
        "static/abp/x.py",
    ],
)
def test_nothing_else_is_served_from_there(stack: Stack, path: str) -> None:
    assert fetch(f"{stack.http_url}/{path}")[0] == 404


def test_the_demos_own_files_are_served_beside_the_apps(stack: Stack) -> None:
    status, headers, _ = fetch(f"{stack.http_url}/static/abpsite/site.css")
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "text/css"
    _, headers, _ = fetch(f"{stack.http_url}/static/abp/console.css")
    assert headers["Content-Type"].split(";")[0] == "text/css"
    # The demo's forms are the app's console now: no script of its own.
    assert fetch(f"{stack.http_url}/static/abpsite/demo.js")[0] == 404
    # Nothing of the demo's is left under the app's folder.
    for name in ("demo.js", "abp.css"):
        assert fetch(f"{stack.http_url}/static/abp/{name}")[0] == 404


@pytest.fixture
def untidy_origins() -> Iterator[None]:
    entries = ["https://A.example/", "https://a.example", "http://localhost:*"]
    with override_settings(ABP={**settings.ABP, "EMBED_ALLOWED_ORIGINS": entries}):
        yield


@pytest.mark.usefixtures("untidy_origins")
def test_allowed_origins_setting_is_normalized_and_deduplicated() -> None:
    assert embed_allowed_origins() == ["https://a.example", "http://localhost:*"]
