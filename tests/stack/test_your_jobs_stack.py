"""A user cancels their own job over the real stack, through "Your jobs"' API and the
CLI: the agent that started it gets exactly one call-result, cancelled by "user",
and the work stops. Another user's cancel of the same id is a 404 and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

from capabilities.access import agent_keys
from capabilities.models import CancelSource, Job, JobStatus
from tests.support.agent import Agent
from tests.support.jobs import wait_running, wait_stopped_by_cancel
from tests.support.stack import Stack
from tests.support.user_jobs import new_user

LONG = {"mode": "checkpoint", "steps": 1500, "stepMs": 20}
CLI = [sys.executable, "-m", "abp_jobs_client"]


def key_of(owner: Any) -> str:
    return agent_keys.create_key("your-jobs-stack", owner=owner)[1]


def post_cancel(stack: Stack, key: str, job_id: uuid.UUID) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{stack.http_url}/abp/jobs/{job_id}/cancel",
        data=json.dumps({"reason": "stop it"}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def cli(stack: Stack, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env={**os.environ, "ABP_URL": stack.ws_url, "ABP_KEY": key},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_cancelled_by_its_user(stack: Stack, agent: Agent, call: str, call_id: str) -> Job:
    """The agent's one call-result is a cancel by "user", and the work stopped on it."""
    payload = agent.result_of(call)["payload"]
    assert payload["cancelled"] is True, payload
    assert payload["error"]["code"] == "CANCELLED"
    assert payload["error"]["details"] == {"source": "user"}
    job = wait_stopped_by_cancel(stack, agent, call_id)
    assert (job.status, job.cancel_source) == (JobStatus.CANCELLED, CancelSource.USER)
    assert not job.hard_killed
    # Nothing more comes for the call: a quick call after it is answered first.
    after = agent.call("test.sleep", {"steps": 0}, call_id=f"{call_id}-after")
    assert agent.result_of(after)["payload"]["success"] is True
    assert len(agent.results_for_call(call_id)) == 1
    return job


def test_a_user_cancels_their_running_job_through_the_api(stack: Stack) -> None:
    alice, bob = new_user(), new_user()
    alice_key, bob_key = key_of(alice), key_of(bob)
    with Agent(stack.ws_url, key=alice_key) as agent:
        agent.initialize()
        call = agent.call("test.sleep", LONG, call_id="mine")
        job = wait_running(agent, "mine")
        assert job.user_id == alice.pk

        status, refused = post_cancel(stack, bob_key, job.id)
        assert (status, refused["error"]["code"]) == (404, "NOT_FOUND")
        assert Job.objects.get(pk=job.id).status == JobStatus.RUNNING
        assert agent.results_for_call("mine") == []

        status, answer = post_cancel(stack, alice_key, job.id)
        assert (status, answer) == (
            200,
            {"id": str(job.id), "cancelled": True, "status": "cancelled"},
        )
        stopped = assert_cancelled_by_its_user(stack, agent, call, "mine")
        assert stopped.cancel_reason == "stop it"

        # Settled now: a second cancel says so and changes nothing.
        status, again = post_cancel(stack, alice_key, job.id)
        assert (status, again["cancelled"], again["status"]) == (200, False, "cancelled")


def test_a_user_lists_and_cancels_their_job_with_the_cli(stack: Stack) -> None:
    alice, bob = new_user(), new_user()
    alice_key, bob_key = key_of(alice), key_of(bob)
    with Agent(stack.ws_url, key=alice_key) as agent:
        agent.initialize()
        call = agent.call("test.sleep", LONG, call_id="from-cli")
        job = wait_running(agent, "from-cli")

        listed = cli(stack, alice_key, "jobs", "--status", "running", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [entry["id"] for entry in json.loads(listed.stdout)["jobs"]] == [str(job.id)]
        table = cli(stack, alice_key, "jobs")
        assert table.stdout.splitlines()[0].split() == [
            "ID", "STATUS", "CAPABILITY", "DOOR", "PROGRESS", "CREATED"
        ]  # fmt: skip
        assert str(job.id) in table.stdout
        assert json.loads(cli(stack, bob_key, "jobs", "--json").stdout)["jobs"] == []

        refused = cli(stack, bob_key, "cancel", str(job.id))
        assert refused.returncode == 1
        assert "NOT_FOUND" in refused.stderr
        assert Job.objects.get(pk=job.id).status == JobStatus.RUNNING

        done = cli(stack, alice_key, "cancel", str(job.id))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"cancelled {job.id}"
        assert_cancelled_by_its_user(stack, agent, call, "from-cli")

        again = cli(stack, alice_key, "--json", "cancel", str(job.id))
        assert again.returncode == 0
        assert json.loads(again.stdout) == {
            "id": str(job.id), "cancelled": False, "status": "cancelled"
        }  # fmt: skip
    assert cli(stack, alice_key, "cancel", "not-an-id").returncode == 2
