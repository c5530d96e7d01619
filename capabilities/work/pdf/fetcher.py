"""The only way a rendered document reaches the network: an SSRF-safe URL fetcher.

`data:` URLs are decoded in memory. `http`/`https` URLs are fetched only from
allow-listed hosts, and only when every address the host resolves to is public;
the connection goes to an address that was checked (no second DNS lookup, so no
DNS rebinding), redirects are not followed, and the body is bounded in size and
time. Every other scheme (`file:`, `ftp:`, ...) is refused.

What a resource becomes once WeasyPrint decodes it is bounded too, before it is
decoded (`resource_checks`): a font by the sizes its header declares, a raster image
by its pixels and format, and all of one render's resources together by a budget
kept in the fetcher, of which there is one per render.

Failures stop the render: WeasyPrint drops a resource that fails with an ordinary
exception, but lets a `FatalURLFetchingError` through::

    BaseException
     └── weasyprint.urls.FatalURLFetchingError
          └── FetchError        carries .url and .reason
               ├── URLNotAllowed    refused by policy: scheme, host, address, redirect
               ├── URLFetchFailed   allowed, but failed: DNS, connection, HTTP status, size
               └── ResourceRefused  fetched, but too large once decoded, or not a format read

The fetcher also keeps the first error it raised (`failure`): WeasyPrint swallows
even a fatal one while it draws an SVG's own images, and the render must still fail.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from weasyprint.urls import (
    HTTP_HEADERS,
    FatalURLFetchingError,
    URLFetcher,
    URLFetcherResponse,
    iri_to_uri,
)

from capabilities.conf import abp_settings
from capabilities.work.pdf import resource_checks
from capabilities.work.raster import Limits

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud instance-metadata endpoints (AWS, GCP, Azure, ...; AWS's IPv6 one too).
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)

_CHUNK_BYTES = 64 * 1024
# How much of a URL a message shows: a data: URL can be megabytes long.
_URL_SHOWN = 60


def shorten_url(url: str) -> str:
    """The URL as messages show it: its first characters only."""
    return url if len(url) <= _URL_SHOWN else url[:_URL_SHOWN] + "…"


class FetchError(FatalURLFetchingError):  # type: ignore[misc]  # WeasyPrint is untyped
    """A URL could not be fetched; stops the render."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{shorten_url(url)}: {reason}")
        self.url = url
        self.reason = reason


class URLNotAllowed(FetchError):
    """The URL is refused by policy; nothing was sent to it."""


class URLFetchFailed(FetchError):
    """The URL is allowed but fetching it failed."""


class ResourceRefused(FetchError):
    """The resource was fetched, but must not be decoded; `limit` is the bound it broke."""

    def __init__(self, url: str, reason: str, limit: int | None = None) -> None:
        super().__init__(url, reason)
        self.limit = limit


@dataclass(frozen=True, kw_only=True)
class ResourceLimits:
    """What one render's resources may become once decoded."""

    font_bytes: int
    """The largest font, by the sizes its header declares."""
    pixels: int
    """The largest raster image, in pixels."""
    total_bytes: int
    """All resources together: fonts as declared, images at 4 bytes a pixel, the rest as is."""


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


@dataclass(frozen=True)
class _Fetched:
    """A resource as fetched, before WeasyPrint sees it."""

    url: str
    body: bytes
    content_type: str
    status: int = 200


class SafeURLFetcher(URLFetcher):  # type: ignore[misc]  # WeasyPrint is untyped
    """Fetches `data:` URLs, and `http(s)` URLs from allow-listed public hosts only.

    One instance serves one render: it keeps that render's resource budget.
    """

    def __init__(
        self,
        *,
        allowed_hosts: Collection[str],
        timeout: float,
        max_bytes: int,
        limits: ResourceLimits,
    ) -> None:
        # fail_on_errors stays off: a malformed data: URL only drops that resource, as
        # WeasyPrint does by default; our refusals and failures are fatal by their type.
        super().__init__(timeout=timeout)
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.limits = limits
        # What the resources fetched so far become once decoded (each fetch counts:
        # WeasyPrint fetches an image once per render, a stylesheet at each use).
        self.resource_bytes = 0
        # The first error raised, kept for when WeasyPrint swallows it.
        self.failure: FetchError | None = None
        self._ssl_context: ssl.SSLContext | None = None

    def fetch(self, url: str, headers: dict[str, str] | None = None) -> URLFetcherResponse:
        """Fetch `url`, or raise URLNotAllowed / URLFetchFailed / ResourceRefused."""
        try:
            fetched = self._fetch(url)
            self._admit(fetched)
        except FetchError as error:
            self.failure = self.failure or error
            raise
        headers = {"Content-Type": fetched.content_type}
        return URLFetcherResponse(fetched.url, fetched.body, headers, fetched.status)

    def _fetch(self, url: str) -> _Fetched:
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            return self._decode(url)
        if scheme not in ("http", "https"):
            raise URLNotAllowed(url, f"the {scheme or 'empty'} scheme is not allowed")
        return self._fetch_http(iri_to_uri(url), tls=scheme == "https")

    def _decode(self, url: str) -> _Fetched:
        # The URL sits in the document or a fetched stylesheet, both bounded already;
        # what it decodes to is bounded as a fetched body is.
        with urllib.request.DataHandler().data_open(urllib.request.Request(url)) as data:
            content_type = data.info()["Content-Type"]
            body = data.read()
        if len(body) > self.max_bytes:
            reason = f"a data: URL of {len(body)} bytes decoded, over {self.max_bytes}"
            raise ResourceRefused(url, reason, self.max_bytes)
        return _Fetched(url, body, content_type)

    def _admit(self, fetched: _Fetched) -> None:
        """Count what the resource becomes once decoded; refuse it past a limit."""
        limits = self.limits
        try:
            footprint = resource_checks.footprint(
                fetched.body, font_bytes=limits.font_bytes, pixels=limits.pixels
            )
        except resource_checks.Refused as refused:
            raise ResourceRefused(fetched.url, refused.reason, refused.limit) from None
        self.resource_bytes += footprint.size
        total = limits.total_bytes
        if self.resource_bytes > total:
            reason = (
                f"the document's resources would take {self.resource_bytes} bytes "
                f"once decoded, over {total}"
            )
            raise ResourceRefused(fetched.url, reason, total)

    def _fetch_http(self, url: str, *, tls: bool) -> _Fetched:
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
            return _Fetched(url, body, content_type, response.status)
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
    """A fetcher for one render, configured from `settings.ABP` (read at each call).

    Images get process.image's pixel limit (the setting, capped by Pillow's own).
    """
    abp = abp_settings()
    return SafeURLFetcher(
        allowed_hosts=abp.URL_FETCH_ALLOWED_HOSTS,
        timeout=abp.URL_FETCH_TIMEOUT_SECONDS,
        max_bytes=abp.URL_FETCH_MAX_BYTES,
        limits=ResourceLimits(
            font_bytes=abp.MAX_FONT_BYTES,
            pixels=Limits.from_settings().pixels,
            total_bytes=abp.MAX_PDF_RESOURCE_BYTES,
        ),
    )
