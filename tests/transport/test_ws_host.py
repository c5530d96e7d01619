"""The WebSocket upgrade's Host is checked against ALLOWED_HOSTS, as Django checks HTTP's."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import override_settings
from websockets.exceptions import InvalidStatus

from capabilities.transport.hosts import allowed_hosts, hosts_of, is_allowed_host
from tests.support.agent import Agent
from tests.support.stack import Stack

ALLOWED = ["app.example.com", ".example.org", "127.0.0.1", "[::1]"]


@pytest.mark.parametrize(
    "host",
    ["app.example.com", "APP.example.com:8443", "example.org", "a.b.example.org:80", "[::1]:8000"],
)
def test_allowed_hosts_pass_with_or_without_a_port(host: str) -> None:
    assert is_allowed_host(host, ALLOWED)


@pytest.mark.parametrize(
    "host", ["evil.example", "app.example.com.evil.net", "example.com", "", "a b", "127.0.0.1:x"]
)
def test_other_hosts_do_not(host: str) -> None:
    assert not is_allowed_host(host, ALLOWED)


def test_an_empty_allow_list_means_localhost_only_under_debug() -> None:
    with override_settings(ALLOWED_HOSTS=[], DEBUG=True):
        assert is_allowed_host("localhost:8000", allowed_hosts())
        assert not is_allowed_host("evil.example", allowed_hosts())
    with override_settings(ALLOWED_HOSTS=[], DEBUG=False):
        assert not is_allowed_host("localhost:8000", allowed_hosts())


def test_every_host_header_counts_and_none_means_the_server_s_address() -> None:
    scope: dict[str, Any] = {"headers": [(b"host", b"a"), (b"host", b"b")], "server": ("s", 80)}
    assert hosts_of(scope) == ["a", "b"]
    assert hosts_of({"headers": [], "server": ("10.0.0.1", 8000)}) == ["10.0.0.1"]


# -- on the real stack --------------------------------------------------------------------


def agent_naming(stack: Stack, host: str) -> Agent:
    """An agent connected to the stack's Daphne, its upgrade naming `host`."""
    port = urlsplit(stack.ws_url).port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return Agent(f"ws://{host}:{port}/abp/ws", sock=sock)
    except BaseException:
        sock.close()
        raise


def test_an_upgrade_naming_another_host_is_refused(stack: Stack) -> None:
    for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil"):
        with pytest.raises(InvalidStatus) as refused:
            agent_naming(stack, host)
        assert refused.value.response.status_code == 403
    # An allowed name other than the address the suite connects to.
    with agent_naming(stack, "localhost") as agent:
        assert agent.initialize()["payload"]["sessionId"]
