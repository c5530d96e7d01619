"""The only way a rendered document reaches the network: an SSRF-safe URL fetcher.

`data:` URLs are decoded in memory. `http`/`https` URLs are fetched only from
allow-listed hosts, and only when every address the host resolves to is public;
the connection goes to an address that was checked (no second DNS lookup, so no
DNS rebinding), redirects are not followed, and the body is bounded in size and
time. Every other scheme (`file:`, `ftp:`, ...) is refused.

Failures stop the render: WeasyPrint drops a resource that fails with an ordinary
exception, but lets a `FatalURLFetchingError` through::

    BaseException
     └── weasyprint.urls.FatalURLFetchingError
          └── FetchError        carries .url and .reason
               ├── URLNotAllowed    refused by policy: scheme, host, address, redirect
               └── URLFetchFailed   allowed, but failed: DNS, connection, HTTP status, size
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
import urllib.request
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from weasyprint.urls import (
    HTTP_HEADERS,
    FatalURLFetchingError,
    URLFetcher,
    URLFetcherResponse,
    iri_to_uri,
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud instance-metadata endpoints (AWS, GCP, Azure, ...; AWS's IPv6 one too).
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)

_CHUNK_BYTES = 64 * 1024


class FetchError(FatalURLFetchingError):  # type: ignore[misc]  # WeasyPrint is untyped
    """A URL could not be fetched; stops the render."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class URLNotAllowed(FetchError):
    """The URL is refused by policy; nothing was sent to it."""


class URLFetchFailed(FetchError):
    """The URL is allowed but fetching it failed."""


class _Deadline:
    """The time left for one fetch: each blocking step gets only what remains."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url = url
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise URLFetchFailed(self.url, f"took longer than {self.seconds} s")
        return left


def _is_forbidden_address(address: IPAddress) -> bool:
    """Whether connecting to `address` could reach something internal.

    A module-level function so that tests can let loopback through to a local server.
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    # is_global alone misses multicast (224.0.0.0/4 and ff0e::/16 count as global).
    return (
        not address.is_global
        or address.is_multicast
        or address.is_reserved
        or address in METADATA_ADDRESSES
    )


class SafeURLFetcher(URLFetcher):  # type: ignore[misc]  # WeasyPrint is untyped
    """Fetches `data:` URLs, and `http(s)` URLs from allow-listed public hosts only."""

    def __init__(self, *, allowed_hosts: Collection[str], timeout: float, max_bytes: int) -> None:
        # fail_on_errors stays off: a malformed data: URL only drops that resource, as
        # WeasyPrint does by default; our refusals and failures are fatal by their type.
        super().__init__(timeout=timeout)
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._ssl_context: ssl.SSLContext | None = None

    def fetch(self, url: str, headers: dict[str, str] | None = None) -> URLFetcherResponse:
        """Fetch `url`, or raise URLNotAllowed / URLFetchFailed."""
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            with urllib.request.DataHandler().data_open(urllib.request.Request(url)) as data:
                content_type = data.info()["Content-Type"]
                return URLFetcherResponse(url, data.read(), {"Content-Type": content_type})
        if scheme not in ("http", "https"):
            raise URLNotAllowed(url, f"the {scheme or 'empty'} scheme is not allowed")
        return self._fetch_http(iri_to_uri(url), tls=scheme == "https")

    def _fetch_http(self, url: str, *, tls: bool) -> URLFetcherResponse:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or (443 if tls else 80)
        except ValueError as error:
            raise URLNotAllowed(url, "malformed URL") from error
        if host not in self.allowed_hosts:
            raise URLNotAllowed(url, f"host {host!r} is not in the allow-list")
        deadline = _Deadline(url, self.timeout)
        sock = self._connect(url, self._resolve(url, host, port), deadline)
        connection: http.client.HTTPConnection | None = None
        response: http.client.HTTPResponse | None = None
        try:
            connection = http.client.HTTPConnection(host, port)
            if tls:
                sock = self._tls().wrap_socket(sock, server_hostname=host)
            # Handing over a connected socket: http.client must not resolve the host again.
            connection.sock = sock
            name = f"[{host}]" if ":" in host else host
            headers = {
                "Host": name if parts.port is None else f"{name}:{port}",
                "User-Agent": HTTP_HEADERS["User-Agent"],
                "Accept": "*/*",
                "Accept-Encoding": "identity",
            }
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            body = self._read_body(url, response, sock, deadline)
            content_type = response.getheader("Content-Type", "")
            return URLFetcherResponse(url, body, {"Content-Type": content_type}, response.status)
        except (OSError, http.client.HTTPException) as error:
            raise URLFetchFailed(url, f"{type(error).__name__}: {error}") from error
        finally:
            if response is not None:
                response.close()
            if connection is not None:
                connection.close()
            sock.close()

    def _resolve(self, url: str, host: str, port: int) -> list[Any]:
        """All of the host's TCP addresses, if every one of them is allowed."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise URLFetchFailed(url, f"cannot resolve {host!r}: {error}") from error
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                raise URLNotAllowed(url, f"{host!r} resolves to a non-IP address")
            address = ipaddress.ip_address(str(sockaddr[0]))
            if _is_forbidden_address(address):
                raise URLNotAllowed(url, f"{host!r} resolves to a non-public address")
        if not infos:
            raise URLFetchFailed(url, f"{host!r} has no address")
        return infos

    def _connect(self, url: str, infos: list[Any], deadline: _Deadline) -> socket.socket:
        """A socket connected to the first reachable one of the checked addresses."""
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in infos:
            timeout = deadline.remaining()
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        raise URLFetchFailed(url, f"cannot connect: {error}")

    def _read_body(
        self,
        url: str,
        response: http.client.HTTPResponse,
        sock: socket.socket,
        deadline: _Deadline,
    ) -> bytes:
        if 300 <= response.status < 400:
            raise URLNotAllowed(url, f"redirects are not followed (HTTP {response.status})")
        if response.status >= 400:
            raise URLFetchFailed(url, f"HTTP {response.status}")
        if response.getheader("Content-Encoding", "identity").lower() != "identity":
            raise URLFetchFailed(url, "compressed responses are not accepted")
        length = response.getheader("Content-Length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            raise URLFetchFailed(url, f"larger than {self.max_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        # Read at most max_bytes + 1: one byte more than allowed is enough to refuse.
        while size <= self.max_bytes and not response.isclosed():
            # The response closes the socket once the body is complete: check first.
            sock.settimeout(deadline.remaining())
            chunk = response.read(min(_CHUNK_BYTES, self.max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > self.max_bytes:
            raise URLFetchFailed(url, f"larger than {self.max_bytes} bytes")
        return b"".join(chunks)

    def _tls(self) -> ssl.SSLContext:
        # Created on first use: loading the CA store costs time most renders never need.
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context


def fetcher_from_settings() -> SafeURLFetcher:
    """A fetcher configured from `settings.ABP` (read at each call)."""
    return SafeURLFetcher(
        allowed_hosts=settings.ABP["URL_FETCH_ALLOWED_HOSTS"],
        timeout=settings.ABP["URL_FETCH_TIMEOUT_SECONDS"],
        max_bytes=settings.ABP["URL_FETCH_MAX_BYTES"],
    )
