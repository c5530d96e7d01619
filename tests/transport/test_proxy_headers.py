"""The client's address behind trusted proxies: X-Forwarded-For read from the right.

A client can put any entries it likes in front of the ones its proxy appends, so
only the nearest untrusted entry counts: rotating the others buys no fresh budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from capabilities.access import page_tokens
from capabilities.models import AgentSession
from capabilities.transport.proxies import behind_trusted_proxies
from tests.support.agent import Agent
from tests.support.stack import Stack

PROXY = "127.0.0.1"
CLIENT = "198.51.100.7"  # what the proxy saw, appended after whatever the client sent


def trusting(*proxies: str) -> Any:
    return override_settings(ABP={**settings.ABP, "TRUSTED_PROXIES": list(proxies)})


def seen_by_app(scope_type: str, peer: str, headers: dict[str, str]) -> dict[str, Any]:
    """The scope the application behind the proxy middleware is called with."""
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(scope)

    scope = {
        "type": scope_type,
        "scheme": "ws" if scope_type == "websocket" else "http",
        "client": [peer, 5555],
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
    }
    asyncio.run(behind_trusted_proxies(app)(scope, None, None))
    return seen


SPOOFED = {"x-forwarded-for": f"10.9.8.7, {CLIENT}, 10.0.0.2", "x-forwarded-proto": "https"}


@pytest.mark.parametrize("scope_type", ["http", "websocket"])
def test_the_client_is_the_nearest_untrusted_forwarded_address(scope_type: str) -> None:
    with trusting(PROXY, "10.0.0.0/8"):
        seen = seen_by_app(scope_type, PROXY, SPOOFED)
    assert seen["client"] == (CLIENT, 0)
    assert seen["scheme"] == ("wss" if scope_type == "websocket" else "https")


def test_headers_from_an_untrusted_peer_are_ignored() -> None:
    with trusting(PROXY):
        seen = seen_by_app("websocket", "203.0.113.9", SPOOFED)
    assert (seen["client"], seen["scheme"]) == (["203.0.113.9", 5555], "ws")


def test_without_trusted_proxies_the_headers_are_ignored() -> None:
    def app(*_: object) -> None: ...

    with trusting():
        assert behind_trusted_proxies(app) is app
        seen = seen_by_app("http", PROXY, SPOOFED)
    assert (seen["client"], seen["scheme"]) == ([PROXY, 5555], "http")


@pytest.mark.parametrize("entry", ["*", "proxy.internal", "10.0.0.1/8", "10.0.0.0/33"])
def test_an_entry_that_is_no_address_or_network_is_refused(entry: str) -> None:
    with trusting(PROXY, entry), pytest.raises(ImproperlyConfigured, match="TRUSTED_PROXIES"):
        behind_trusted_proxies(object())


# -- on the real stack --------------------------------------------------------------------


@pytest.fixture(scope="module")
def behind_proxy(stack: Stack) -> Iterator[str]:
    """host:port of a Daphne that trusts 127.0.0.1 (the tests play its proxy)."""
    env = {"ABP_TRUSTED_PROXIES": PROXY, "ABP_PAGE_TOKEN_CALLS_PER_MINUTE": "2"}
    with stack.another_web("daphne-proxied", env) as where:
        yield where


def page_agent(where: str, forwarded_for: str) -> Agent:
    origin = f"http://{where}"
    return Agent(
        f"ws://{where}/abp/ws",
        key=None,
        subprotocols=["abp", f"abp.bearer.{page_tokens.issue(origin)}"],
        additional_headers={"Origin": origin, "X-Forwarded-For": forwarded_for},
    )


def test_rotating_x_forwarded_for_buys_no_fresh_budget(stack: Stack, behind_proxy: str) -> None:
    outcomes, sessions = [], []
    for spoofed in ("10.9.8.1", "10.9.8.2", "10.9.8.3"):
        with page_agent(behind_proxy, f"{spoofed}, {CLIENT}") as agent:
            agent.initialize()
            outcomes.append(agent.result_of(agent.call("test.sleep", {"steps": 0}))["payload"])
            sessions.append(agent.session_id)
    assert [outcome["success"] for outcome in outcomes] == [True, True, False]
    assert outcomes[2]["error"]["details"] == {"limit": "callsPerMinute", "max": 2}
    recorded = AgentSession.objects.filter(pk__in=sessions)
    assert {(s.client_address, s.principal) for s in recorded} == {(CLIENT, f"page:{CLIENT}")}
    # The stack's own Daphne trusts no proxy: the same header changes nothing there.
    with page_agent(stack.http_url.removeprefix("http://"), f"10.9.8.4, {CLIENT}") as agent:
        agent.initialize()
        session_id = agent.session_id
    assert AgentSession.objects.get(pk=session_id).client_address == "127.0.0.1"


def test_the_proxy_s_scheme_makes_https_download_urls(behind_proxy: str) -> None:
    headers = {"X-Forwarded-For": CLIENT, "X-Forwarded-Proto": "https"}
    with Agent(f"ws://{behind_proxy}/abp/ws", additional_headers=headers) as agent:
        agent.initialize()
        call = agent.call("test.sleep", {"steps": 0, "fileBytes": 300 * 1024})
        reference = agent.result_of(call)["payload"]["data"]["file"]
    assert reference["downloadUrl"].startswith(f"https://{behind_proxy}/abp/files/")
