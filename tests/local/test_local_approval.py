"""Approvals in local mode (``LocalAgentSystem``): an inline tool that needs approval waits like an
asynchronous one — the thread goes idle with nothing running, no ``TurnComplete`` — and a decision resumes
it in its own step."""

from __future__ import annotations

from stepagent.agent_config import AgentConfig
from stepagent.events import ApprovalRequested, EventCollector, TurnComplete
from stepagent.history_items import approval_states, waiting_for_approval
from stepagent.messages import InputMessage
from stepagent.modes.local import LocalAgentSystem
from stepagent.providers.scripted import ScriptedProvider
from stepagent.tools.functions import tool

SCRIPT = {
    "rules": [
        {
            "when": "add",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"when": "^5$", "on": ["tool_result"], "reply": [{"text": "It is 5."}]},
        {"when": "^7$", "on": ["tool_result"], "reply": [{"text": "It is 7."}]},
    ],
    "default": [{"text": "ok"}],
}


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_an_inline_tool_waits_for_approval_in_local_mode_and_an_edit_resumes_it() -> None:
    collector = EventCollector()
    system = LocalAgentSystem.create(
        ScriptedProvider(SCRIPT), tools=[add], agent=AgentConfig(approval=("add",)), observer=collector
    )
    async with system:
        await system.send(InputMessage.user_text("t1", "add two and three"), "m1")
        await system.wait_idle(10.0)  # waiting for a person keeps nothing resident
        history = await system.thread("t1").history()
        waiting = waiting_for_approval(history)
        assert waiting is not None and waiting.call.name == "add"
        events = collector.of("t1")
        assert ApprovalRequested("add", {"a": 2, "b": 3}, waiting.call.id) in events
        assert not any(isinstance(e, TurnComplete) for e in events)

        decision = InputMessage.approval("t1", waiting.call.id, "edit", args={"a": 3, "b": 4})
        await system.send(decision, "a1")
        await system.wait_idle(10.0)
        history = await system.thread("t1").history()
        assert approval_states(history) == {waiting.call.id: "edited"}
        assert any(isinstance(e, TurnComplete) for e in collector.of("t1"))
        texts = [getattr(item, "text", None) for item in history]
        assert texts[-1] == "It is 7."
