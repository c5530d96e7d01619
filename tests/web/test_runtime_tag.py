"""`{% load abp %}{% abp_runtime %}`: `window.abp` on a host's own pages, and abp/base.html."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.template import engines
from django.test import RequestFactory

from capabilities.access import page_tokens

ORIGIN = "http://127.0.0.1:8000"


class HeadReader(HTMLParser):
    """The elements of <head>, in order, as (tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[tuple[str, dict[str, str | None]]] = []
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "head":
            self._in_head = True
        elif self._in_head:
            self.head.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self._in_head = False


def render(source: str, *, with_request: bool = True) -> str:
    template = engines["django"].from_string(source)
    if not with_request:
        return template.render({})
    # The request context processor puts the request in the context, as on a real page.
    return template.render({}, request=RequestFactory().get("/", HTTP_HOST="127.0.0.1:8000"))


def test_the_tag_renders_the_runtime_with_a_page_token_for_the_pages_origin() -> None:
    html = render("{% load abp %}{% abp_runtime %}")
    reader = HeadReader()
    reader.feed(f"<head>{html}</head>")
    (script_tag, script), (link_tag, link) = reader.head
    assert script_tag == "script"
    assert script["src"] == "/static/abp/runtime.js"
    # Synchronous: a classic script, neither deferred nor async.
    assert not {"async", "defer", "type"} & set(script)
    assert script["data-endpoint"] == "/abp/ws"
    assert script["data-token-url"] == "/abp/page-token/"
    assert script["data-token-max-age"] == "600"
    assert script["data-manifest"] == "/abp.json"
    assert script["data-app-id"]
    assert script["data-app-name"]
    assert script["data-app-version"]
    token = script["data-token"] or ""
    page_tokens.verify(token, origin=ORIGIN)
    assert (link_tag, link) == ("link", {"rel": "abp-manifest", "href": "/abp.json"})


def test_without_the_request_the_tag_names_the_context_processor() -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape("context_processors.request")):
        render("{% load abp %}{% abp_runtime %}", with_request=False)


def test_the_base_template_loads_the_runtime_first_and_no_stylesheet() -> None:
    html = render('{% extends "abp/base.html" %}{% block title %}Mine{% endblock %}')
    reader = HeadReader()
    reader.feed(html)
    first_tag, first = reader.head[0]
    assert first_tag == "script"
    assert first["src"] == "/static/abp/runtime.js"
    assert [tag for tag, _ in reader.head].count("script") == 1
    assert not [attrs for tag, attrs in reader.head if attrs.get("rel") == "stylesheet"]
    assert "<title>Mine</title>" in html
