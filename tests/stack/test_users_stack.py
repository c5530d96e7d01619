"""A Django user behind every call, over the real stack: the key's owner is `ctx.user`
in the worker, the job records its user, and a capability's permissions refuse a user
without them before anything is stored."""

from __future__ import annotations

from typing import Any

import anyio

from capabilities.access import agent_keys
from capabilities.models import Job
from tests.support.agent import Agent
from tests.support.mcp_clients import official_client
from tests.support.people import person
from tests.support.stack import Stack


def user(*perms: str) -> Any:
    return person(*perms, prefix="s")


def key_for(owner: Any = None, scopes: tuple[str, ...] = ()) -> str:
    return agent_keys.create_key("users-stack", owner=owner, scopes=scopes)[1]


def agent_for(stack: Stack, owner: Any = None, scopes: tuple[str, ...] = ()) -> Agent:
    connected = Agent(stack.ws_url, key=key_for(owner, scopes))
    connected.initialize()
    return connected


def payload(agent: Agent, capability: str, call_id: str) -> dict[str, Any]:
    result: dict[str, Any] = agent.result_of(agent.call(capability, {}, call_id=call_id))["payload"]
    return result


def test_the_keys_owner_is_ctx_user_in_the_worker_and_on_the_job(stack: Stack) -> None:
    allowed = user("auth.view_user")
    with agent_for(stack, allowed) as agent:
        done = payload(agent, "test.guarded", "mine")
        assert done["success"] is True, done
        assert done["data"] == {"user": allowed.get_username()}
        job = Job.objects.get(session_id=agent.session_id, call_id="mine")
        assert job.user_id == allowed.pk
        assert job.principal == f"user:{allowed.pk}"
    with agent_for(stack) as service:
        assert payload(service, "test.whoami", "nobody")["data"] == {"user": None}
        assert Job.objects.get(session_id=service.session_id, call_id="nobody").user_id is None


def test_a_user_without_the_permission_is_refused_before_anything_is_stored(
    stack: Stack,
) -> None:
    with agent_for(stack, user()) as agent:
        error = payload(agent, "test.guarded", "not-mine")["error"]
        assert error["code"] == "PERMISSION_DENIED"
        assert error["details"] == {"capability": "test.guarded", "missing": ["auth.view_user"]}
        assert not Job.objects.filter(session_id=agent.session_id).exists()
    with agent_for(stack, user("auth.view_user"), scopes=("test.whoami",)) as scoped:
        error = payload(scoped, "test.guarded", "out-of-scope")["error"]
        assert error["code"] == "PERMISSION_DENIED"
        assert error["details"]["scopes"] == ["test.whoami"]
        assert payload(scoped, "test.whoami", "in-scope")["success"] is True


OURS = {"test.whoami", "test.guarded"}


def test_each_door_lists_only_what_the_caller_may_call(stack: Stack) -> None:
    allowed, lacking = user("auth.view_user"), user()
    for owner, expected in ((allowed, OURS), (lacking, {"test.whoami"})):
        agent = Agent(stack.ws_url, key=key_for(owner))
        with agent:
            listed = agent.initialize()["payload"]["capabilities"]
            assert {entry["name"] for entry in listed} & OURS == expected
            reply = agent.reply_to(agent.send("capabilities/list", {}), "capabilities/list-result")
            assert {entry["name"] for entry in reply["payload"]["capabilities"]} & OURS == expected

        async def tools(key: str) -> set[str]:
            async with official_client(f"{stack.http_url}/mcp", key=key) as client:
                return {tool.name for tool in (await client.list_tools()).tools}

        assert anyio.run(tools, key_for(owner)) & OURS == expected
