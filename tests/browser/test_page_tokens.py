"""Credentials in the browser: page tokens for the app's own pages, agent keys for client.js.

The pages render a signed page token; runtime.js and the embed bridge offer it as the
WebSocket subprotocol `abp.bearer.<token>`, refresh it from /abp/page-token/ when it
is old, and retry once with a fresh one when the app finds it expired. A refused
connection (4401, or 4403 when its key is revoked) fails what waits on it with
PERMISSION_DENIED, naming the reason.
"""

from __future__ import annotations

import json
import time
from typing import Any
from unittest import mock

from django.core import signing
from playwright.sync_api import Page, Request

from capabilities.access import agent_keys, page_tokens
from capabilities.endings import key_revocation
from capabilities.models import AgentKey, Job, JobStatus
from tests.browser.conftest import ParentSite
from tests.browser.support import orm, orm_eventually, until
from tests.support.stack import Stack

AGENT = {
    "agent": {"name": "token-test", "version": "1"},
    "protocolVersion": "0.1",
    "features": {"notifications": True, "progress": True},
}

# Resolves with {ok, sessionId} or {ok: false, code, message, retryable}: a rejection's
# own fields do not survive page.evaluate.
INITIALIZE = """async (params) => {
  try {
    const session = await abp.initialize(params);
    return { ok: true, sessionId: session.sessionId };
  } catch (error) {
    return { ok: false, code: error.code, message: error.message, retryable: error.retryable };
  }
}"""

CONNECT_THROUGH_BRIDGE = """async (app) => {
  const frame = document.getElementById("bridge");
  const client = await window.abpClient.connect({ window: frame.contentWindow, origin: app });
  window.client = client;
  try {
    const session = await client.initialize({ agent: { name: "parent page", version: "1" } });
    return { ok: true, sessionId: session.sessionId };
  } catch (error) {
    return { ok: false, code: error.code, message: error.message, retryable: error.retryable };
  }
}"""

CONNECT_WITH_TOKEN = """async ({ module, url, token }) => {
  const { connect } = await import(module);
  let client;
  try {
    client = await connect(token === null ? { url } : { url, token });
  } catch (error) {
    return { ok: false, stage: "connect", code: error.code, message: error.message };
  }
  window.client = client;
  window.closes = [];
  client.onClose((info) => window.closes.push(info));
  try {
    const session = await client.initialize({ agent: { name: "key agent", version: "1" } });
    return { ok: true, sessionId: session.sessionId };
  } catch (error) {
    return { ok: false, code: error.code, message: error.message, retryable: error.retryable };
  }
}"""

RUNTIME = 'script[src$="/abp/runtime.js"]'

# Runs in every frame before its scripts; on /abp/embed/ it changes the rendered config
# before bridge.js reads it. (Rewriting the HTML with page.route would not do: Chromium
# treats a document served by the interceptor as public, and its Local Network Access
# checks then block the WebSocket to 127.0.0.1.)
EMBED_CONFIG_CHANGES = """(changes) => {
  if (location.pathname !== "/abp/embed/") return;
  const observer = new MutationObserver(() => {
    const element = document.getElementById("abp-embed-config");
    if (element === null || !element.textContent) return;
    observer.disconnect();
    const config = JSON.parse(element.textContent);
    if (changes.tamper) config.token = changes.tamper(config.token);
    Object.assign(config, changes.set);
    element.textContent = JSON.stringify(config);
    window.configChanged = true;
  });
  observer.observe(document, { childList: true, subtree: true });
}"""

TAMPER = "(token) => token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A')"


def change_runtime_data(page: Page, **values: str) -> None:
    """Change the runtime's data-* attributes; it reads them when initialize() is called."""
    page.evaluate(
        "([selector, values]) => Object.assign(document.querySelector(selector).dataset, values)",
        [RUNTIME, values],
    )


def change_embed_config(page: Page, *, tamper: bool = False, **values: Any) -> None:
    """Have every /abp/embed/ page this tab loads from now on render a changed config."""
    changes = f"{{tamper: {TAMPER if tamper else 'null'}, set: {json.dumps(values)}}}"
    page.add_init_script(script=f"({EMBED_CONFIG_CHANGES})({changes})")


def expired_token(origin: str) -> str:
    """A genuine page token for `origin`, signed an hour ago (past any max age)."""
    an_hour_ago = signing.b62_encode(int(time.time()) - 3600)
    with mock.patch.object(signing.TimestampSigner, "timestamp", return_value=an_hour_ago):
        return page_tokens.issue(origin)


def token_requests(page: Page) -> list[Request]:
    """Every request for a fresh page token the page (or a frame in it) makes from now on."""
    requests: list[Request] = []

    def on_request(request: Request) -> None:
        if "/abp/page-token/" in request.url:
            requests.append(request)

    page.on("request", on_request)
    return requests


def assert_refused(outcome: dict[str, Any], reason: str) -> None:
    assert outcome["ok"] is False, outcome
    assert outcome["code"] == "PERMISSION_DENIED", outcome
    assert outcome["message"] == f"The app refused the connection: {reason}.", outcome


# --- window.abp -----------------------------------------------------------------------


def test_the_runtime_offers_its_page_token_as_a_subprotocol(page: Page, stack: Stack) -> None:
    handshakes: list[dict[str, Any]] = []
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")

    def on_handshake(event: dict[str, Any]) -> None:
        handshakes.append(event)

    cdp.on("Network.webSocketWillSendHandshakeRequest", on_handshake)
    fetched = token_requests(page)
    page.goto(f"{stack.http_url}/")
    token = page.get_attribute(RUNTIME, "data-token")
    assert token
    assert page.get_attribute(RUNTIME, "data-token-url") == "/abp/page-token/"

    assert page.evaluate(INITIALIZE, AGENT)["ok"] is True
    until(page, lambda: handshakes)
    headers = {k.lower(): v for k, v in handshakes[0]["request"]["headers"].items()}
    assert headers["sec-websocket-protocol"].replace(" ", "") == f"abp,abp.bearer.{token}"
    assert "access_token" not in handshakes[0].get("url", "")
    # A fresh token is used as it is: nothing fetched.
    assert fetched == []
    page.evaluate("() => abp.shutdown()")


def test_a_tampered_page_token_is_refused(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    token = page.get_attribute(RUNTIME, "data-token")
    assert token
    change_runtime_data(page, token=token[:-1] + ("A" if token[-1] != "A" else "B"))
    fetched = token_requests(page)

    outcome = page.evaluate(INITIALIZE, AGENT)
    assert_refused(outcome, "invalid-credentials")
    assert outcome["retryable"] is False
    assert page.evaluate("() => abp.initialized") is False
    # Only an expired token is worth a fresh one.
    assert fetched == []
    call = page.evaluate("() => abp.call('test.sleep', {steps: 0})")
    assert call["error"]["code"] == "NOT_INITIALIZED"


def test_a_missing_page_token_is_refused(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    # No token and no URL to get one from: the socket opens without a credential.
    change_runtime_data(page, token="", tokenUrl="")
    assert_refused(page.evaluate(INITIALIZE, AGENT), "missing-credentials")


def test_an_old_page_token_is_refreshed_before_connecting(page: Page, stack: Stack) -> None:
    fetched = token_requests(page)
    page.goto(f"{stack.http_url}/")
    assert page.get_attribute(RUNTIME, "data-token-max-age") == "600"
    # As if the page had rendered a token good for 2 s, then waited past half of it.
    change_runtime_data(page, tokenMaxAge="2")
    page.wait_for_timeout(1200)
    assert fetched == []

    outcome = page.evaluate(INITIALIZE, AGENT)
    assert outcome["ok"] is True, outcome
    assert [request.method for request in fetched] == ["GET"]
    response = fetched[0].response()
    assert response is not None
    assert response.status == 200
    assert response.url == f"{stack.http_url}/abp/page-token/"
    result = page.evaluate("() => abp.call('test.sleep', {steps: 0, echo: 'fresh'})")
    assert result["data"]["echo"] == "fresh"
    page.evaluate("() => abp.shutdown()")


def test_an_expired_page_token_is_retried_once_with_a_fresh_one(page: Page, stack: Stack) -> None:
    fetched = token_requests(page)
    page.goto(f"{stack.http_url}/")
    # A page restored from a cache an hour later: its token is genuine but expired.
    change_runtime_data(page, token=expired_token(stack.http_url))

    outcome = page.evaluate(INITIALIZE, AGENT)
    assert outcome["ok"] is True, outcome
    assert len(fetched) == 1
    page.evaluate("() => abp.shutdown()")


def test_an_expired_page_token_without_a_fresh_one_is_refused(page: Page, stack: Stack) -> None:
    page.route(
        f"{stack.http_url}/abp/page-token/",
        lambda route: route.fulfill(status=503, body="down for maintenance"),
    )
    page.goto(f"{stack.http_url}/")
    change_runtime_data(page, token=expired_token(stack.http_url))
    outcome = page.evaluate(INITIALIZE, AGENT)
    assert_refused(outcome, "expired-credentials")
    assert outcome["retryable"] is False


# --- the embed bridge -----------------------------------------------------------------


def open_parent(page: Page, parent_site: ParentSite, stack: Stack) -> None:
    """The parent page on the allowed origin, its bridge loaded with a changed config."""
    page.goto(parent_site.url(parent_site.allowed, "parent.html", app=stack.http_url))
    page.wait_for_function("() => window.parentReady === true")
    bridge = page.frame(name="bridge")
    assert bridge is not None
    bridge.wait_for_load_state()
    assert bridge.evaluate("() => window.configChanged") is True


def test_the_bridge_relays_a_refusal_as_permission_denied(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    change_embed_config(page, tamper=True)
    open_parent(page, parent_site, stack)
    outcome = page.evaluate(CONNECT_THROUGH_BRIDGE, stack.http_url)
    assert_refused(outcome, "invalid-credentials")
    assert outcome["retryable"] is False
    # The parent's client knows the connection is gone, and why.
    later = page.evaluate("() => window.client.call('test.sleep', {steps: 0})")
    assert later["error"]["code"] == "PERMISSION_DENIED"


def test_the_bridge_retries_an_expired_token_with_a_fresh_one(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    change_embed_config(page, token=expired_token(stack.http_url))
    fetched = token_requests(page)
    open_parent(page, parent_site, stack)
    page.evaluate(
        """() => {
          window.heard = [];
          const frame = document.getElementById("bridge");
          window.addEventListener("message", (event) => {
            if (event.source === frame.contentWindow) window.heard.push(event.data.type);
          });
        }"""
    )
    outcome = page.evaluate(CONNECT_THROUGH_BRIDGE, stack.http_url)
    assert outcome["ok"] is True, outcome
    assert len(fetched) == 1
    result = page.evaluate("() => window.client.call('test.sleep', {steps: 0, echo: 'relayed'})")
    assert result["data"]["echo"] == "relayed"
    # The refused socket stayed the bridge's business: the parent heard no refusal.
    heard = page.evaluate("() => window.heard")
    assert "notification" not in heard, heard
    assert "abp-bridge/closed" not in heard, heard


def test_the_bridge_refreshes_an_old_token_before_connecting(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    change_embed_config(page, tokenMaxAgeSeconds=2)
    fetched = token_requests(page)
    open_parent(page, parent_site, stack)
    page.wait_for_timeout(1200)  # past half the token's max age
    assert fetched == []
    outcome = page.evaluate(CONNECT_THROUGH_BRIDGE, stack.http_url)
    assert outcome["ok"] is True, outcome
    assert len(fetched) == 1


# --- client.js with an agent key --------------------------------------------------------


def connect_with(page: Page, stack: Stack, token: str | None) -> dict[str, Any]:
    module = f"{stack.http_url}/static/abp/client.js"
    outcome: dict[str, Any] = page.evaluate(
        CONNECT_WITH_TOKEN, {"module": module, "url": stack.ws_url, "token": token}
    )
    return outcome


def test_client_js_connects_with_an_agent_key(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    _, key = orm(lambda: agent_keys.create_key("browser test agent"))
    # An agent's own page on another origin (the app's origin check lets it through).
    page.goto(parent_site.url(parent_site.allowed, "blank.html"))

    outcome = connect_with(page, stack, key)
    assert outcome["ok"] is True, outcome
    result = page.evaluate("() => window.client.call('test.sleep', {steps: 0, echo: 'keyed'})")
    assert result["data"]["echo"] == "keyed"
    page.evaluate("() => window.client.shutdown()")

    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    refused = connect_with(page, stack, wrong)
    assert_refused(refused, "invalid-credentials")
    assert refused["retryable"] is False
    assert page.evaluate("() => window.closes.map((c) => c.code)") == [4401]

    assert_refused(connect_with(page, stack, None), "missing-credentials")
    # A page token is good on its own origin only.
    app_token = page_tokens.issue(stack.http_url)
    assert_refused(connect_with(page, stack, app_token), "invalid-credentials")


def test_a_revoked_key_cancels_its_calls_and_closes_with_4403(
    page: Page, parent_site: ParentSite, stack: Stack
) -> None:
    row, key = orm(lambda: agent_keys.create_key("browser test agent, revoked"))
    page.goto(parent_site.url(parent_site.allowed, "blank.html"))
    assert connect_with(page, stack, key)["ok"] is True
    page.evaluate(
        "() => { window.sleeper = window.client.call('test.sleep', {steps: 500, stepMs: 20}, "
        "{callId: 'revoked-sleeper'}); }"
    )
    orm_eventually(Job.objects.filter(call_id="revoked-sleeper", status=JobStatus.RUNNING).exists)
    assert orm(lambda: key_revocation.revoke(AgentKey.objects.filter(pk=row.pk))) == 1

    sleeper = page.evaluate("() => window.sleeper")
    assert sleeper["success"] is False
    assert sleeper["cancelled"] is True, sleeper
    page.wait_for_function("() => window.closes.length > 0")
    assert page.evaluate("() => window.closes.map((c) => c.code)") == [4403]
    later = page.evaluate("() => window.client.call('test.sleep', {steps: 0})")
    assert later["error"]["code"] == "PERMISSION_DENIED"
    assert later["error"]["message"] == "The app refused the connection: key-revoked."
    assert later["error"]["retryable"] is False
    # The key cannot open another connection.
    assert_refused(connect_with(page, stack, key), "key-revoked")
