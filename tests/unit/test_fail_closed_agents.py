"""The worker's own start-up check (``StepConfig``): approval entries that select no tool and dollar limits
on unpriced models are configuration errors, for the default agent and for every profile, with the tools
known at that point (function, RAP and MCP tools alike)."""

from __future__ import annotations

import pytest

from stepagent.agent_config import AgentConfig, AgentProfile
from stepagent.core.agents import check_agents
from stepagent.errors import ConfigurationError
from stepagent.providers.prices import parse_prices
from stepagent.tools.base import Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import tool


@tool
def search(q: str) -> str:
    """Search."""
    return q


@tool
def crm__update(record: str) -> str:
    """An MCP-style tool name."""
    return record


TOOLS = Toolset.of([*builtin_tools(), search, crm__update])


def test_approval_entries_must_each_select_a_tool() -> None:
    check_agents(AgentConfig(approval=("search", "crm__*", "spawn_thread")), TOOLS, {})
    with pytest.raises(ConfigurationError) as raised:
        check_agents(AgentConfig(approval=("serch", "crm_*x", "spawn_*")), TOOLS, {})
    lines = str(raised.value).splitlines()
    assert len(lines) == 3
    assert (
        lines[0].startswith("STEPAGENT_APPROVAL: 'serch' matches no tool")
        and "did you mean search" in lines[0]
    )
    assert "'spawn_*'" in lines[2]  # a pattern never selects a built-in: it must be named exactly


def test_a_profile_approval_entry_is_checked_as_the_setting_is() -> None:
    agent = AgentConfig(profiles={"ops": AgentProfile(name="ops", approval=("searhc",))})
    with pytest.raises(ConfigurationError, match=r"profile 'ops': approval: 'searhc' matches no tool"):
        check_agents(agent, TOOLS, {})


def test_a_dollar_limit_needs_the_model_priced() -> None:
    agent = AgentConfig(max_conversation_cost_usd=1.0)
    with pytest.raises(
        ConfigurationError, match=r"STEPAGENT_MAX_CONVERSATION_COST_USD=\$1 cannot be enforced"
    ):
        check_agents(agent, TOOLS, {}, default_model="scripted:demo.json")
    check_agents(agent, TOOLS, {}, default_model="anthropic:claude-sonnet-4-5")  # catalogued
    priced = parse_prices('{"scripted:demo.json": {"input": 1, "output": 1}}')
    check_agents(agent, TOOLS, {}, default_model="scripted:demo.json", prices=priced)


def test_a_profile_on_an_unpriced_model_cannot_inherit_a_dollar_limit() -> None:
    profile = AgentProfile(name="cheap", model="openai:my-local-llama")
    agent = AgentConfig(max_conversation_cost_usd=2.0, profiles={"cheap": profile})
    with pytest.raises(ConfigurationError, match=r"for profile 'cheap', model openai:my-local-llama"):
        check_agents(agent, TOOLS, {"openai:my-local-llama": object()}, default_model="openai:gpt-4o")  # type: ignore[dict-item]
