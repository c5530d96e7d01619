"""A rolling restart under load, as Kubernetes does one: no call is lost.

Agents (the Python client, which resumes after 1012) make calls without pause through
one address, as through a Service. A second Daphne comes up, the address sends new
connections to it, and the first is stopped with SIGTERM (it drains). Then a second
heavy worker comes up and the first is stopped with SIGTERM (Celery's warm shutdown),
then replaced. Every call made is answered exactly once, and successfully.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import Counter
from typing import Any

from abp_jobs_client import AsyncClient

from tests.support.stack import ManagedProcess, Stack, free_port, port_open, python_tool
from tests.support.tcp_relay import TcpRelay

AGENTS = 4
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("test.sleep", {"steps": 15, "stepMs": 20}),  # 0.3 s on a heavy worker
    ("convert.markdownToHtml", {"markdown": "# rolling"}),
    ("test.sleep", {"steps": 40, "stepMs": 20}),  # 0.8 s
]


def surge_worker(stack: Stack) -> ManagedProcess:
    """One more heavy worker, under a name of its own (a new pod's)."""
    return ManagedProcess(
        "worker-surge",
        python_tool(
            "celery", "-A", "abpsite", "worker", "-Q", "abp.heavy", "-P", "prefork",
            "-c", "2", "-l", "info", "-n", f"surge-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle",
        ),
        stack.run_dir,
    )  # fmt: skip


async def agent(url: str, stop: asyncio.Event, answers: Counter[str], errors: list[str]) -> int:
    """Calls one after another until `stop`; how many it made."""
    made = 0
    async with AsyncClient(url, key=os.environ["ABP_TEST_AGENT_KEY"]) as client:
        for capability, params in itertools.cycle(CALLS):
            if stop.is_set():
                break
            made += 1
            try:
                result = await client.call(capability, params)
            except Exception as error:  # every answer is counted, failures too
                errors.append(f"{capability}: {type(error).__name__}: {error}")
                continue
            answers[result.call_id] += 1
    return made


def test_a_rolling_restart_of_a_daphne_and_a_worker_under_load_loses_no_call(
    stack: Stack,
) -> None:
    first_port, second_port = free_port(), free_port()
    first = stack.new_web(first_port, name="daphne-rolling-1")
    first.start(lambda: port_open(first_port))
    second = stack.new_web(second_port, name="daphne-rolling-2")
    surge = surge_worker(stack)
    relay = TcpRelay(first_port)
    answers: Counter[str] = Counter()
    errors: list[str] = []

    async def scenario() -> list[int]:
        stop = asyncio.Event()
        url = f"ws://127.0.0.1:{relay.port}/abp/ws"
        load = [asyncio.create_task(agent(url, stop, answers, errors)) for _ in range(AGENTS)]
        await asyncio.sleep(2)
        # The web: a new instance, the address to it, the old one stopped.
        await asyncio.to_thread(second.start, lambda: port_open(second_port))
        relay.send_new_connections_to(second_port)
        await asyncio.to_thread(first.stop)
        await asyncio.sleep(2)
        # A heavy worker: a new one, the old one stopped, then replaced.
        await asyncio.to_thread(surge.start, lambda: " ready." in surge.log_text())
        await asyncio.to_thread(stack.worker.stop)
        await asyncio.to_thread(stack.start_worker)
        await asyncio.to_thread(surge.stop)
        await asyncio.sleep(2)
        stop.set()
        return await asyncio.gather(*load)

    try:
        made = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
    finally:
        relay.close()
        for process in (first, second, surge):
            process.kill()
    assert errors == []
    assert sum(made) == sum(answers.values()) == len(answers) > 8 * AGENTS
    assert set(answers.values()) == {1}
    assert "Stopping:" in first.log_text(), first.tail()
