"""The MCP door's DNS-rebinding settings, from Django's own (no I/O)."""

from __future__ import annotations

from django.test import override_settings

from capabilities.mcp_door.app import transport_security


@override_settings(ALLOWED_HOSTS=["jobs.example.com", ".example.org"], DEBUG=False)
def test_allowed_hosts_are_the_hosts_mcp_answers_on_any_port() -> None:
    found = transport_security()
    assert found.enable_dns_rebinding_protection is True
    assert found.allowed_hosts == [
        "jobs.example.com",
        "jobs.example.com:*",
        "example.org",
        "example.org:*",
    ]


@override_settings(ALLOWED_HOSTS=[], DEBUG=True)
def test_none_under_debug_is_djangos_localhost_fallback() -> None:
    hosts = transport_security().allowed_hosts
    assert set(hosts) >= {"localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*"}


@override_settings(ALLOWED_HOSTS=[], DEBUG=False)
def test_none_without_debug_allows_no_host() -> None:
    assert transport_security().allowed_hosts == []


@override_settings(ALLOWED_HOSTS=["*"])
def test_a_wildcard_turns_the_check_off() -> None:
    assert transport_security().enable_dns_rebinding_protection is False
