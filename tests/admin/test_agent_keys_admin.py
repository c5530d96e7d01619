"""Agent keys from the operator's side: the admin and the management commands."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from capabilities.access import agent_keys
from capabilities.models import AgentKey, AgentSession
from tests.support.admin_clients import client_for
from tests.support.agent import Agent
from tests.support.stack import Stack

pytestmark = pytest.mark.usefixtures("database")

KEY = re.compile(r"abp_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def test_adding_a_key_in_the_admin_shows_it_once(stack: Stack) -> None:
    client = client_for(staff=True)
    response = client.post(
        reverse("admin:capabilities_agentkey_add"),
        {"name": "billing agent", "max_concurrent_calls": "4", "calls_per_minute": ""},
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    shown = KEY.findall(response.content.decode())
    assert len(set(shown)) == 1
    key = AgentKey.objects.get(name="billing agent")
    assert (key.max_concurrent_calls, key.calls_per_minute) == (4, None)
    assert shown[0].startswith(f"abp_{key.prefix}_")
    # Never again: not on the change page, not in the list.
    for url in (
        reverse("admin:capabilities_agentkey_change", args=[key.pk]),
        reverse("admin:capabilities_agentkey_changelist"),
    ):
        page = client.get(url).content.decode()
        assert shown[0] not in page
        assert f"abp_{key.prefix}_" in page
    # And it works.
    with Agent(stack.ws_url, key=shown[0]) as agent:
        session_id = agent.initialize()["payload"]["sessionId"]
    sessions = reverse("admin:capabilities_agentsession_changelist")
    assert "billing agent" in client.get(f"{sessions}?q={session_id}").content.decode()


def test_revoke_action_revokes_and_keys_cannot_be_deleted() -> None:
    client = client_for(staff=True)
    key, _ = agent_keys.create_key("to revoke in the admin")
    changelist = reverse("admin:capabilities_agentkey_changelist")
    response = client.post(
        changelist, {"action": "revoke_selected", "_selected_action": [str(key.pk)]}, follow=True
    )
    assert "Revoked 1 key(s)" in response.content.decode()
    assert AgentKey.objects.get(pk=key.pk).is_revoked
    assert "delete_selected" not in client.get(changelist).content.decode()
    delete = reverse("admin:capabilities_agentkey_delete", args=[key.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403


def test_keys_are_for_staff_only() -> None:
    changelist = reverse("admin:capabilities_agentkey_changelist")
    assert client_for(staff=False).get(changelist).status_code == 302
    anonymous = Client(HTTP_HOST="127.0.0.1")
    assert anonymous.get(reverse("admin:capabilities_agentkey_add")).status_code == 302


def test_management_commands_create_and_revoke(stack: Stack) -> None:
    out = io.StringIO()
    call_command("create_agent_key", "cli agent", "--calls-per-minute", "9", "--quiet", stdout=out)
    plaintext = out.getvalue().strip()
    assert KEY.fullmatch(plaintext)
    key = AgentKey.objects.get(name="cli agent")
    assert key.calls_per_minute == 9

    verbose = io.StringIO()
    call_command("create_agent_key", "other", stdout=verbose)
    assert "store it now" in verbose.getvalue()
    assert KEY.search(verbose.getvalue())

    with Agent(stack.ws_url, key=plaintext) as agent:
        agent.initialize()
        out = io.StringIO()
        call_command("revoke_agent_key", key.prefix, stdout=out)
        assert "Revoked 1 key(s)" in out.getvalue()
        note = agent.wait_for(lambda e: e["type"] == "notification")
        assert note["payload"]["data"]["details"]["reason"] == "key-revoked"
    assert AgentSession.objects.filter(agent_key=key).exists()
    call_command("revoke_agent_key", plaintext, stdout=io.StringIO())  # whole key, again: fine
    with pytest.raises(CommandError, match="No agent key with prefix 00000000"):
        call_command("revoke_agent_key", "00000000")
