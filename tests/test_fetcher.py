"""SafeURLFetcher: what it refuses, and how it fetches what it allows.

Loopback is forbidden, so the tests that need a real server (redirects, size,
timeout, success) serve from 127.0.0.1 and open the one seam meant for it:
`_is_forbidden_address`, patched to let loopback through.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from weasyprint.urls import FatalURLFetchingError

from capabilities import fetcher
from capabilities.fetcher import (
    SafeURLFetcher,
    URLFetchFailed,
    URLNotAllowed,
    fetcher_from_settings,
)


@dataclass
class Route:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/plain"})
    body: bytes = b"hello"
    # Send the body without Content-Length, the end marked by closing the connection.
    close_delimited: bool = False
    # Wait this long (or until the test ends) before answering.
    delay: float = 0.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]
    requests: list[tuple[str, str]]
    released: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) leaves the handler writing to a closed socket.
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.requests.append((self.path, self.headers.get("Host", "")))
        route = self.server.routes.get(self.path, Route(status=404, body=b""))
        if route.delay:
            self.server.released.wait(route.delay)
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        if not route.close_delimited:
            self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        self.wfile.write(route.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    """A local HTTP server on 127.0.0.1; its `routes` say what each path answers."""
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.routes, httpd.requests, httpd.released = {}, [], threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.released.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Open the address seam for loopback only, so the local server is reachable."""
    original = fetcher._is_forbidden_address
    monkeypatch.setattr(
        fetcher,
        "_is_forbidden_address",
        lambda address: not address.is_loopback and original(address),
    )


def resolve_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> list[str]:
    """Make every DNS lookup answer `addresses`; returns the list of names looked up."""
    looked_up: list[str] = []

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        looked_up.append(host)
        results: list[Any] = []
        for address in addresses:
            if ipaddress.ip_address(address).version == 6:
                results.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                results.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return results

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return looked_up


def make(hosts: list[str], *, timeout: float = 2.0, max_bytes: int = 1000) -> SafeURLFetcher:
    return SafeURLFetcher(allowed_hosts=hosts, timeout=timeout, max_bytes=max_bytes)


def test_errors_stop_the_render() -> None:
    assert issubclass(URLNotAllowed, FatalURLFetchingError)
    assert issubclass(URLFetchFailed, FatalURLFetchingError)
    error = URLNotAllowed("file:///x", "no")
    assert (error.url, error.reason) == ("file:///x", "no")


def test_data_url_is_decoded() -> None:
    response = make([]).fetch("data:text/plain;base64,aGVsbG8=")
    assert response.read() == b"hello"
    assert response.content_type == "text/plain"


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "ftp://example.com/file.png",
        "gopher://example.com/",
        "javascript:alert(1)",
    ],
)
def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(URLNotAllowed) as caught:
        make(["example.com"]).fetch(url)
    assert caught.value.url == url
    assert "scheme" in caught.value.reason


@pytest.mark.parametrize(
    ("hosts", "url"),
    [
        ([], "http://example.com/a.png"),
        (["example.com"], "https://example.org/a.png"),
        (["example.com"], "http://sub.example.com/a.png"),
        (["example.com"], "http://example.com.evil.test/a.png"),
    ],
)
def test_hosts_outside_the_allow_list_are_refused_before_any_lookup(
    monkeypatch: pytest.MonkeyPatch, hosts: list[str], url: str
) -> None:
    looked_up = resolve_to(monkeypatch, "93.184.215.14")
    with pytest.raises(URLNotAllowed, match="allow-list"):
        make(hosts).fetch(url)
    assert looked_up == []


def test_localhost_is_refused_even_when_allow_listed() -> None:
    with pytest.raises(URLNotAllowed, match="non-public"):
        make(["localhost"]).fetch("http://localhost/x.png")


@pytest.mark.parametrize(
    "addresses",
    [
        ("127.0.0.1",),
        ("10.0.0.1",),
        ("172.16.5.4",),
        ("192.168.1.1",),
        ("100.64.0.1",),
        ("169.254.169.254",),
        ("0.0.0.0",),
        ("224.0.0.1",),
        ("::1",),
        ("::ffff:127.0.0.1",),
        ("fe80::1",),
        ("fd00:ec2::254",),
        ("ff0e::1",),
        # Any one bad address is enough.
        ("93.184.215.14", "10.0.0.1"),
    ],
)
def test_hosts_resolving_to_internal_addresses_are_refused(
    monkeypatch: pytest.MonkeyPatch, addresses: tuple[str, ...]
) -> None:
    resolve_to(monkeypatch, *addresses)
    with pytest.raises(URLNotAllowed, match="non-public"):
        make(["images.example.com"]).fetch("https://images.example.com/a.png")


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"])
def test_public_addresses_are_not_forbidden(address: str) -> None:
    assert not fetcher._is_forbidden_address(ipaddress.ip_address(address))


def test_a_name_that_does_not_resolve_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(URLFetchFailed, match="resolve"):
        make(["nowhere.example"]).fetch("http://nowhere.example/")


@pytest.mark.usefixtures("allow_loopback")
def test_fetches_an_allowed_url(server: _Server) -> None:
    server.routes["/a.css?v=1"] = Route(headers={"Content-Type": "text/css"}, body=b"p{}")
    port = server.server_address[1]
    response = make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{port}/a.css?v=1#frag")
    assert response.read() == b"p{}"
    assert response.content_type == "text/css"
    assert server.requests == [("/a.css?v=1", f"127.0.0.1:{port}")]


@pytest.mark.usefixtures("allow_loopback")
def test_connects_to_the_checked_address_without_resolving_again(
    monkeypatch: pytest.MonkeyPatch, server: _Server
) -> None:
    # A rebinding DNS would answer differently the second time: there is no second time.
    looked_up = resolve_to(monkeypatch, "127.0.0.1")
    server.routes["/x"] = Route()
    port = server.server_address[1]
    assert make(["cdn.example.com"]).fetch(f"http://cdn.example.com:{port}/x").read() == b"hello"
    assert looked_up == ["cdn.example.com"]
    assert server.requests == [("/x", f"cdn.example.com:{port}")]


@pytest.mark.usefixtures("allow_loopback")
def test_redirects_are_refused(server: _Server) -> None:
    server.routes["/r"] = Route(status=302, headers={"Location": "http://169.254.169.254/"})
    port = server.server_address[1]
    with pytest.raises(URLNotAllowed, match="redirect"):
        make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{port}/r")
    assert [path for path, _ in server.requests] == ["/r"]


@pytest.mark.usefixtures("allow_loopback")
@pytest.mark.parametrize("close_delimited", [False, True])
def test_bodies_over_max_bytes_fail(server: _Server, close_delimited: bool) -> None:
    server.routes["/big"] = Route(body=b"x" * 1001, close_delimited=close_delimited)
    server.routes["/fits"] = Route(body=b"x" * 1000, close_delimited=close_delimited)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with pytest.raises(URLFetchFailed, match="larger than 1000 bytes"):
        make(["127.0.0.1"], max_bytes=1000).fetch(f"{base}/big")
    assert len(make(["127.0.0.1"], max_bytes=1000).fetch(f"{base}/fits").read()) == 1000


@pytest.mark.usefixtures("allow_loopback")
def test_http_errors_fail(server: _Server) -> None:
    with pytest.raises(URLFetchFailed, match="HTTP 404"):
        make(["127.0.0.1"]).fetch(f"http://127.0.0.1:{server.server_address[1]}/missing")


@pytest.mark.usefixtures("allow_loopback")
def test_slow_servers_time_out(server: _Server) -> None:
    server.routes["/slow"] = Route(delay=5.0)
    started = time.monotonic()
    with pytest.raises(URLFetchFailed):
        make(["127.0.0.1"], timeout=0.2).fetch(f"http://127.0.0.1:{server.server_address[1]}/slow")
    assert time.monotonic() - started < 1.0


def test_fetcher_from_settings_reads_abp_settings() -> None:
    limits = {"URL_FETCH_ALLOWED_HOSTS": ["CDN.example.com"], "URL_FETCH_TIMEOUT_SECONDS": 1.5}
    with override_settings(ABP={**settings.ABP, **limits, "URL_FETCH_MAX_BYTES": 42}):
        configured = fetcher_from_settings()
    assert configured.allowed_hosts == frozenset({"cdn.example.com"})
    assert (configured.timeout, configured.max_bytes) == (1.5, 42)


def test_the_default_allow_list_is_empty() -> None:
    assert settings.ABP["URL_FETCH_ALLOWED_HOSTS"] == []
    with pytest.raises(URLNotAllowed):
        fetcher_from_settings().fetch("https://example.com/")
