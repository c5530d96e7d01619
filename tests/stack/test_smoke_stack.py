"""First light: initialize and one call over the real stack."""

from tests.support.agent import Agent
from tests.support.stack import Stack


def test_call_round_trip(stack: Stack) -> None:
    with Agent(stack.ws_url) as agent:
        agent.initialize()
        mid = agent.call("test.sleep", {"steps": 2, "stepMs": 5, "echo": "hi"}, call_id="c1")
        result = agent.result_of(mid)
        assert result["payload"]["success"] is True
        assert result["payload"]["data"] == {"echo": "hi", "steps": 2}
