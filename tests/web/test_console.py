"""`/abp/console/`: for signed-in users only, with `window.abp` bound to them (no database)."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from django.shortcuts import resolve_url
from django.test import RequestFactory
from django.urls import reverse

from capabilities.access import page_tokens
from capabilities.web.console import console

ORIGIN = "http://127.0.0.1:8000"


class Scripts(HTMLParser):
    """The page's <script> elements' attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts.append(dict(attrs))


def request_as(user: User | AnonymousUser, method: str = "get") -> HttpRequest:
    request: HttpRequest = getattr(RequestFactory(), method)(
        "/abp/console/", HTTP_HOST="127.0.0.1:8000"
    )
    request.user = user  # what AuthenticationMiddleware sets
    return request


def test_the_console_is_at_abp_console() -> None:
    assert reverse("abp-console") == "/abp/console/"


def test_a_visitor_is_sent_to_sign_in_first() -> None:
    response = console(request_as(AnonymousUser()))
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert target.path == resolve_url(settings.LOGIN_URL)
    assert parse_qs(target.query) == {"next": ["/abp/console/"]}


def test_a_signed_in_user_gets_the_runtime_bound_to_them_then_the_console() -> None:
    user = User(pk=4242, username="ada")
    response = console(request_as(user))
    assert response.status_code == 200
    # The page token in it is this user's: it is never to be kept by a cache.
    assert "no-store" in response["Cache-Control"]
    assert "private" in response["Cache-Control"]
    body = response.content.decode()
    assert "Signed in as <strong>ada</strong>" in body
    reader = Scripts()
    reader.feed(body)
    runtime, module = reader.scripts
    assert runtime["src"] == "/static/abp/runtime.js"
    assert page_tokens.verify(runtime["data-token"] or "", origin=ORIGIN) == 4242
    assert (module["type"], module["src"]) == ("module", "/static/abp/console.js")
    assert 'href="/static/abp/console.css"' in body


def test_only_get_is_answered() -> None:
    user = User(pk=4242, username="ada")
    assert console(request_as(user, "post")).status_code == 405
