"""An MCP client that follows the authorization spec connects with no key pasted.

The official MCP Python SDK's `OAuthClientProvider` runs the whole flow against the
real stack: the 401's challenge, the Protected Resource Metadata, the authorization
server's metadata, registration (Dynamic Client Registration, or a Client ID Metadata
Document), PKCE, the sign-in and consent pages in Chromium, the code with RFC 9207's
`iss`, the token. Then it lists and calls tools as the user who consented, on both
wires, and the token cancels a task it made.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from playwright.async_api import Route, async_playwright

from capabilities.models import Job, JobStatus
from tests.access.test_oauth_tokens import issued
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS
from tests.stack.test_mcp_inspector import PACKAGE, inspector
from tests.support import people
from tests.support.agent import Agent
from tests.support.mcp_clients import RawSession
from tests.support.node_scripts import node_for
from tests.support.stack import Stack
from tests.testapp.cimd_documents import HOST as CIMD_HOST

PASSWORD = "consent-in-chromium"
# Any port: Chromium's request to it is answered by the test (page.route), and
# loopback redirect URIs match on any port (RFC 8252).
CALLBACK = "http://127.0.0.1:8976/callback"
LONG = {"mode": "checkpoint", "steps": 500, "stepMs": 20}


class Memory:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def person() -> Any:
    return people.person(password=PASSWORD, prefix="oauth")


def new_flow(stack: Stack) -> tuple[Any, str, Consenting, Memory]:
    """A user who may sign in, the stack's /mcp, their browser, and the client's storage."""
    user = person()
    return user, f"{stack.http_url}/mcp", Consenting(user.get_username()), Memory()


class Consenting:
    """The user's browser: signs in and allows, where the SDK sends it."""

    def __init__(self, username: str) -> None:
        self.username = username
        self.redirected_to = ""
        self.consent_text = ""

    async def redirect(self, authorization_url: str) -> None:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            try:
                page = await browser.new_page()

                async def arrived(route: Route) -> None:
                    self.redirected_to = route.request.url
                    await route.fulfill(status=200, body="You may close this window.")

                await page.route(f"{CALLBACK}*", arrived)
                await page.goto(authorization_url)
                # Not signed in: Django's login page, then back to the consent page.
                await page.fill("#id_username", self.username)
                await page.fill("#id_password", PASSWORD)
                await page.click("button[type=submit]")
                await page.wait_for_selector("#authorizationForm")
                self.consent_text = await page.inner_text("main")
                await page.click("button[name=allow]")
                await page.wait_for_function("() => document.body.innerText.includes('close')")
            finally:
                await browser.close()

    async def callback(self) -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(self.redirected_to).query)
        return AuthorizationCodeResult(
            code=query["code"][0], state=query["state"][0], iss=query.get("iss", [None])[0]
        )


@asynccontextmanager
async def connected(
    mcp_url: str, consenting: Consenting, storage: Memory, *, cimd: bool, mode: str
) -> AsyncIterator[Client]:
    provider = OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="SDK test agent",
            redirect_uris=[CALLBACK],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=consenting.redirect,
        callback_handler=consenting.callback,
        client_metadata_url=f"{CIMD_HOST}clients/sdk.json" if cimd else None,
    )
    async with (
        httpx2.AsyncClient(auth=provider, timeout=30) as http,
        Client(streamable_http_client(mcp_url, http_client=http), mode=mode) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("registration", "mode"), [("dcr", "legacy"), ("cimd", "auto")], ids=["dcr-2025", "cimd-2026"]
)
def test_the_sdk_connects_by_oauth_and_acts_as_the_user_who_consented(
    stack: Stack, registration: str, mode: str
) -> None:
    user, mcp_url, consenting, storage = new_flow(stack)
    found: dict[str, Any] = {}

    async def main() -> None:
        cimd = registration == "cimd"
        async with connected(mcp_url, consenting, storage, cimd=cimd, mode=mode) as client:
            tools = await client.list_tools()
            found["tools"] = {tool.name for tool in tools.tools}
            result = await client.call_tool("test.whoami", {})
            found["whoami"] = result.structured_content

    anyio.run(main)

    assert "test.whoami" in found["tools"]
    assert found["whoami"] == {"user": user.get_username()}
    # The consent page named the client, where it sends the user back, and the scope.
    assert "127.0.0.1" in consenting.consent_text
    assert "Run capabilities for you" in consenting.consent_text
    assert storage.tokens is not None
    assert storage.client is not None
    if registration == "cimd":
        assert storage.client.client_id == f"{CIMD_HOST}clients/sdk.json"
    job = Job.objects.filter(user=user, capability="test.whoami").get()
    assert job.client == storage.client.client_id


def test_a_token_from_the_flow_cancels_its_own_task_and_no_one_elses(stack: Stack) -> None:
    user, mcp_url, consenting, storage = new_flow(stack)
    found: dict[str, Any] = {}

    async def main() -> None:
        async with connected(mcp_url, consenting, storage, cimd=False, mode="auto") as client:
            await client.list_tools()
        assert storage.tokens is not None
        async with httpx2.AsyncClient(timeout=30) as http:
            session = RawSession(http, mcp_url, storage.tokens.access_token)
            await session.open()
            try:
                created = await session_rpc(
                    session,
                    "tools/call",
                    {"name": "test.sleep", "arguments": LONG, "task": {"ttl": 60_000}},
                )
                task_id = created["result"]["task"]["taskId"]
                found["cancel"] = await session_rpc(session, "tasks/cancel", {"taskId": task_id})
            finally:
                await session.close()

    anyio.run(main)

    assert found["cancel"]["result"]["status"] == "cancelled"
    job = Job.objects.get(user=user, capability="test.sleep")
    assert job.status == JobStatus.CANCELLED


async def session_rpc(session: RawSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    request_id = uuid.uuid4().int % 1_000_000
    async with session.request(request_id, method, params) as messages:
        [answer] = [message async for message in messages if message.get("id") == request_id]
    return answer


def test_a_refresh_token_rotates_and_a_reused_one_is_refused(stack: Stack) -> None:
    _, mcp_url, consenting, storage = new_flow(stack)
    found: dict[str, Any] = {}

    async def main() -> None:
        async with connected(mcp_url, consenting, storage, cimd=False, mode="auto") as client:
            await client.list_tools()
        assert storage.tokens is not None
        assert storage.client is not None
        first = storage.tokens.refresh_token
        form = {
            "grant_type": "refresh_token",
            "refresh_token": first,
            "client_id": storage.client.client_id,
            "resource": mcp_url,
        }
        async with httpx2.AsyncClient(timeout=30) as http:
            rotated = await http.post(f"{stack.http_url}/o/token", data=form)
            again = await http.post(f"{stack.http_url}/o/token", data=form)
        found["rotated"] = (rotated.status_code, rotated.json(), rotated.headers)
        found["again"] = again.status_code

    anyio.run(main)

    status, body, headers = found["rotated"]
    assert status == 200
    assert storage.tokens is not None
    assert body["refresh_token"] != storage.tokens.refresh_token
    assert "no-store" in headers["cache-control"]
    assert found["again"] == 400


@pytest.fixture(scope="module")
def inspector_node() -> str:
    return node_for(PACKAGE, "@modelcontextprotocol/inspector")


def test_the_inspector_calls_with_a_token_issued_for_mcp_and_not_one_issued_for_nothing(
    inspector_node: str, stack: Stack, tmp_path: Path
) -> None:
    node = inspector_node
    user = person()
    mcp_url = f"{stack.http_url}/mcp"
    call = ["--method", "tools/call", "--tool-name", "test.whoami", "--tool-args-json", "{}"]
    for era in ("legacy", "auto"):
        answer = inspector(node, stack, issued(user, resource=[mcp_url]), tmp_path / era,
                           "--protocol-era", era, *call)  # fmt: skip
        assert answer["result"]["structuredContent"] == {"user": user.get_username()}, answer
    # Refused with the challenge, the Inspector turns to OAuth (which needs a person).
    with pytest.raises(AssertionError, match="auth_required"):
        inspector(node, stack, issued(user, resource=[]), tmp_path / "none", *call)


def test_a_capability_that_needs_another_scope_steps_the_token_up(stack: Stack) -> None:
    user, mcp_url, consenting, storage = new_flow(stack)
    found: dict[str, Any] = {}

    async def main() -> None:
        async with connected(mcp_url, consenting, storage, cimd=False, mode="auto") as client:
            found["before"] = storage.tokens.scope if storage.tokens else None
            # 403 insufficient_scope names `jobs test:scoped`; the SDK asks the user
            # again (the consent page, in Chromium) and retries with the new token.
            result = await client.call_tool("test.scoped", {})
            found["scoped"] = result.structured_content
            found["after"] = storage.tokens.scope if storage.tokens else None

    anyio.run(main)

    assert found["scoped"] == {"user": user.get_username()}
    assert set((found["after"] or "").split()) == {"jobs", "test:scoped"}
    assert "test:scoped" not in (found["before"] or "")


def test_revoking_an_apps_token_closes_the_sessions_it_opened_and_no_others(
    stack: Stack,
) -> None:
    from oauth2_provider.models import AccessToken

    from capabilities.endings import user_deactivation

    user = person()
    site = f"{stack.http_url}/"
    revoked, kept = issued(user, resource=[site]), issued(user, resource=[site])
    revoked_row = AccessToken.objects.get(token_checksum=_checksum(revoked))
    with Agent(stack.ws_url, key=revoked) as by_revoked, Agent(stack.ws_url, key=kept) as other:
        assert "error" not in by_revoked.initialize()["payload"]
        assert "error" not in other.initialize()["payload"]
        answer = httpx2.post(
            f"{stack.http_url}/o/revoke_token",
            data={"token": revoked, "client_id": revoked_row.application.client_id},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert by_revoked.read_until_closed(timeout=user_deactivation.closed_within()) == 4403
        refusal = [
            note["payload"]["data"]["details"]["reason"]
            for note in by_revoked.inbox
            if note["payload"].get("event") == "notifications/error"
        ]
        assert refusal == ["token-revoked"]
        # Another app of the same user keeps its session.
        still = other.call("test.whoami", {}, call_id="still-here")
        assert other.result_of(still)["payload"]["success"] is True
    with Agent(stack.ws_url, key=revoked) as again:
        assert again.read_until_closed() == 4401


def _checksum(token: str) -> str:
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()
