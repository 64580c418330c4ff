"""Local mode takes the same AgentConfig as the worker: the prompt and built-ins, profiles selected by a
root's metadata (their models built from the spec), and a ``TurnComplete`` observer event per finished turn."""

from __future__ import annotations

from typing import Any

from stepagent.agent_config import AgentConfig, AgentProfile
from stepagent.events import EventCollector, TurnComplete
from stepagent.messages import InputMessage
from stepagent.modes.local import LocalAgentSystem
from stepagent.providers.base import ModelRequest
from stepagent.providers.scripted import ScriptedProvider
from tests.engine.test_agents import Recording
from tests.integration.aws_helpers import script_file

TIMEOUT = 10.0


async def run(system: LocalAgentSystem, *messages: InputMessage) -> None:
    async with system:
        for index, message in enumerate(messages):
            await system.send(message, f"d{index}")
            await system.wait_idle(TIMEOUT)


async def test_local_mode_takes_the_agent_config_and_reports_turn_complete() -> None:
    model = Recording(ScriptedProvider({"default": [{"text": "local answer"}]}))
    collector = EventCollector()
    agent = AgentConfig(system_prompt="You are local.", max_tokens=64, builtin_tools="none")
    system = LocalAgentSystem.create(model, agent=agent, observer=collector)
    await run(system, InputMessage.user_text("t1", "hello"), InputMessage.user_text("t1", "again"))
    requests: list[ModelRequest] = model.requests
    assert [r.tools for r in requests] == [[], []]
    assert all(r.system.startswith("You are local.") and r.max_tokens == 64 for r in requests)
    done = [e for e in collector.of("t1") if isinstance(e, TurnComplete)]
    assert len(done) == 2 and all(d.model == "scripted:inline" and d.usage.output_tokens > 0 for d in done)
    assert done[0].version < done[1].version
    stored = [r async for r in system.conversation.usage_records("t1")]
    assert [(r.input_tokens, r.output_tokens) for r in stored] == [
        (d.usage.input_tokens, d.usage.output_tokens) for d in done
    ]


async def test_a_local_profile_model_is_built_from_its_spec() -> None:
    script: dict[str, Any] = {"default": [{"text": "from the profile"}]}
    spec = f"scripted:{script_file(script)}"
    default = Recording(ScriptedProvider({"default": [{"text": "from the default"}]}))
    collector = EventCollector()
    agent = AgentConfig(profiles={"p": AgentProfile(name="p", model=spec, system_prompt="Profile P.")})
    system = LocalAgentSystem.create(default, agent=agent, observer=collector)
    assert set(system.config.providers) == {spec}
    await run(system, InputMessage.user_text("t1", "hi", metadata={"profile": "p"}))
    assert default.requests == []
    [done] = [e for e in collector.of("t1") if isinstance(e, TurnComplete)]
    assert done.model == spec
    history = await system.thread("t1").history()
    assert "from the profile" in str(history[-1])
