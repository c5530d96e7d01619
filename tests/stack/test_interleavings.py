"""Random interleavings on the real stack: every call answered exactly once.

A hypothesis state machine drives one agent through calls that succeed, fail,
crash or time out, cancels (of running, finished and unknown calls), dropped
connections resumed, sessions taken over by a second connection, and shutdowns,
against the real Daphne, worker and Redis. After each run, across all the
connections a session had: one call-result per call, one cancel-result per
cancel, and each cancel-result consistent with its call's result.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from capabilities.protocol import replies
from tests.support.agent import Agent, Envelope
from tests.support.stack import Stack


@dataclass
class SessionRecord:
    """What one session did, over however many connections it had."""

    session_id: str
    token: str
    connections: list[Agent]
    calls: list[str] = field(default_factory=list)
    # (callId, the connection it was sent on, the envelope id its reply echoes)
    cancels: list[tuple[str, Agent, str]] = field(default_factory=list)
    ended: bool = False

    @property
    def agent(self) -> Agent:
        return self.connections[-1]

    def received(self) -> list[Envelope]:
        return [envelope for agent in self.connections for envelope in agent.inbox]


class Interleavings(RuleBasedStateMachine):
    """One agent doing random things to its sessions."""

    stack: Stack

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[SessionRecord] = []
        self.counter = 0
        self.start_session()

    def start_session(self) -> None:
        agent = Agent(self.stack.ws_url)
        payload = agent.initialize(notifications=True)["payload"]
        self.sessions.append(SessionRecord(payload["sessionId"], payload["resumeToken"], [agent]))

    @property
    def current(self) -> SessionRecord:
        return self.sessions[-1]

    @rule(
        steps=st.integers(0, 12),
        mode=st.sampled_from(["checkpoint", "checkpoint", "checkpoint", "fail", "crash"]),
        timeout_ms=st.sampled_from([None, None, None, 120]),
    )
    def call(self, steps: int, mode: str, timeout_ms: int | None) -> None:
        self.counter += 1
        call_id = f"c{self.counter}"
        params = {"steps": steps, "stepMs": 10, "mode": mode}
        self.current.agent.call("test.sleep", params, call_id=call_id, timeout_ms=timeout_ms)
        self.current.calls.append(call_id)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        call_id = data.draw(st.sampled_from([*self.current.calls, "never-called"]))
        reply = self.current.agent.cancel(call_id)
        # Waited for: a cancel-result is a reply on this connection, not kept for a resume.
        self.current.agent.reply_to(reply, "capabilities/cancel-result")
        self.current.cancels.append((call_id, self.current.agent, reply))

    @rule(pause_ms=st.integers(0, 120))
    def wait(self, pause_ms: int) -> None:
        time.sleep(pause_ms / 1000)

    @rule()
    def drop_and_resume(self) -> None:
        old = self.current.agent
        old.ws.close()
        old.read_until_closed()
        self.resume()

    @rule()
    def take_over(self) -> None:
        old = self.current.agent
        self.resume()
        assert old.read_until_closed() == 4409

    def resume(self) -> None:
        agent = Agent(self.stack.ws_url)
        payload = agent.resume(self.current.session_id, self.current.token, notifications=True)
        assert payload["payload"]["sessionId"] == self.current.session_id, payload
        self.current.token = payload["payload"]["resumeToken"]
        self.current.connections.append(agent)

    @rule()
    def shutdown(self) -> None:
        self.current.agent.send("shutdown", {"reason": "interleavings"})
        assert self.current.agent.read_until_closed() == 1000
        self.current.ended = True
        self.start_session()

    def teardown(self) -> None:
        record = self.current
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            results_for(record, call_id) for call_id in record.calls
        ):
            with contextlib.suppress(TimeoutError):
                record.agent.receive(timeout=0.5)
        time.sleep(0.3)  # anything sent twice would be here by now
        try:
            while True:
                record.agent.receive(timeout=0.2)
        except TimeoutError:
            pass
        for agent in record.connections:
            agent.close()
        for session in self.sessions:
            check(session)


def results_for(record: SessionRecord, call_id: str) -> list[dict[str, Any]]:
    return [
        envelope["payload"]
        for envelope in record.received()
        if envelope["type"] == "capabilities/call-result"
        and envelope["payload"].get("callId") == call_id
    ]


def check(record: SessionRecord) -> None:
    """Exactly one result per call; cancel-results consistent with them."""
    for call_id in record.calls:
        results = results_for(record, call_id)
        assert len(results) == 1, (record.session_id, call_id, results)
    called = set(record.calls)
    stray = {
        envelope["payload"].get("callId")
        for envelope in record.received()
        if envelope["type"] == "capabilities/call-result"
    } - called
    assert not stray, stray
    for call_id, connection, reply_id in record.cancels:
        answers = [
            envelope["payload"]
            for envelope in connection.inbox
            if envelope["type"] == "capabilities/cancel-result" and envelope["id"] == reply_id
        ]
        assert len(answers) == 1, (call_id, answers)
        answer = answers[0]
        if call_id not in called:
            assert answer == {"callId": call_id, "cancelled": False, "reason": replies.NOT_FOUND}
            continue
        [result] = results_for(record, call_id)
        if answer["cancelled"]:
            assert result.get("cancelled") is True, (answer, result)
        else:
            assert answer["reason"] == replies.ALREADY_COMPLETED, answer
            assert not result.get("cancelled"), (answer, result)


def test_random_interleavings_answer_every_call_exactly_once(stack: Stack) -> None:
    Interleavings.stack = stack
    run_state_machine_as_test(
        Interleavings,
        settings=settings(
            max_examples=int(os.environ.get("ABP_INTERLEAVING_EXAMPLES", "12")),
            stateful_step_count=14,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=False,
        ),
    )
