"""Origin allow-lists: entries written as browsers write origins, and matching."""

from __future__ import annotations

import pytest

from capabilities.access.origins import BadOrigin, is_allowed, normalize_all, normalize_origin


@pytest.mark.parametrize(
    ("entry", "origin"),
    [
        ("https://App.Example.com", "https://app.example.com"),
        ("https://app.example.com/", "https://app.example.com"),
        ("https://app.example.com:443", "https://app.example.com"),
        ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
        ("http://localhost:*", "http://localhost:*"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_allowed_origins_are_written_as_browsers_write_them(entry: str, origin: str) -> None:
    assert normalize_origin(entry) == origin


@pytest.mark.parametrize(
    "entry", ["*", "null", "app.example.com", "https://app.example.com/path", "ftp://x", "http://"]
)
def test_what_is_not_an_origin_is_refused(entry: str) -> None:
    with pytest.raises(BadOrigin):
        normalize_origin(entry)


def test_lists_are_normalized_and_deduplicated() -> None:
    assert normalize_all(["https://A.example/", "https://a.example", "http://x:*"]) == [
        "https://a.example",
        "http://x:*",
    ]


PATTERNS = ["https://app.example.com", "http://127.0.0.1:*", "http://[::1]:*"]


@pytest.mark.parametrize(
    "origin",
    [
        "https://app.example.com",
        "https://APP.example.com:443",
        "http://127.0.0.1:8000",
        "http://127.0.0.1",
        "http://[::1]:9",
    ],
)
def test_allowed_origins_match(origin: str) -> None:
    assert is_allowed(origin, PATTERNS)


@pytest.mark.parametrize(
    "origin",
    [
        "http://app.example.com",  # another scheme
        "https://app.example.com:8443",  # another port
        "https://evil.app.example.com",
        "https://app.example.com.evil.net",
        "http://127.0.0.1:*",  # a pattern is not an origin
        "http://127.0.0.10:80",
        "null",
        "",
        "http://127.0.0.1:80x",
    ],
)
def test_other_origins_do_not(origin: str) -> None:
    assert not is_allowed(origin, PATTERNS)
