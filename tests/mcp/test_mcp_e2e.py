"""An agent calls an MCP stdio server's tool, and a function tool that times out, through the in-process
function runner (the engine harness in step mode)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from stepagent.history_items import AssistantText, ToolResultItem
from stepagent.messages import ToolResult
from stepagent.providers.base import ModelRequest, StreamEvent
from stepagent.tools.functions import InProcessFunctionRunner, tool
from stepagent.tools.mcp import load_mcp_tools
from stepagent.tools.mcp_config import McpServer
from tests.engine.harness import Harness
from tests.rap.stack import FunctionModel, call, last_input, say

ECHO = str(Path(__file__).parent / "fixtures" / "echo_server.py")


@tool(timeout=0.05)
async def slow_lookup(query: str) -> str:
    """A lookup that takes far too long."""
    await asyncio.sleep(5)
    return query


def model(request: ModelRequest) -> list[StreamEvent]:
    text = last_input(request.history)
    if text == "echo please":
        return call("echo__echo", "call-echo", text="from the agent")
    if text == "look it up":
        return call("slow_lookup", "call-slow", query="x")
    return say(f"model saw: {text}")


async def test_an_mcp_tool_is_called_by_the_agent_through_the_function_runner() -> None:
    mcp_tools = await load_mcp_tools([McpServer(name="echo", command=sys.executable, args=(ECHO,))])
    h = Harness(FunctionModel(model), [*mcp_tools, slow_lookup])
    h.config.runner = InProcessFunctionRunner([*mcp_tools, slow_lookup])
    assert "echo__echo" in h.config.runner.tools  # MCP tools are invocable, like function tools

    await h.say("t", "echo please", "m1")
    history = await h.history("t")
    assert history[-2] == ToolResultItem(result=ToolResult.text("call-echo", "echo: from the agent"))
    assert history[-1] == AssistantText(text="model saw: echo: from the agent")


async def test_a_function_tool_that_times_out_answers_with_an_error() -> None:
    h = Harness(FunctionModel(model), [slow_lookup])
    h.config.runner = InProcessFunctionRunner([slow_lookup])
    await h.say("t", "look it up", "m1")
    history = await h.history("t")
    expected = "Error: tool 'slow_lookup' timed out after 0.05 s"
    assert history[-2] == ToolResultItem(result=ToolResult.text("call-slow", expected))
    assert history[-1] == AssistantText(text=f"model saw: {expected}")
