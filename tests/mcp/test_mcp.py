"""MCP tools through the official SDK: listing and calling over stdio (a real subprocess) and streamable
HTTP (served in process on loopback), error mapping, and name handling."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError, ToolError
from stepagent.rap.server import serve_in_background
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import Invocable, tool
from stepagent.tools.mcp import McpConnection, McpTool, load_mcp_tools, tool_name
from stepagent.tools.mcp_config import McpServer
from tests.mcp.fixtures.echo_server import build

ECHO = str(Path(__file__).parent / "fixtures" / "echo_server.py")
STDIO = McpServer(name="echo", command=sys.executable, args=(ECHO,))


def by_name(tools: list[McpTool]) -> dict[str, McpTool]:
    return {t.name: t for t in tools}


def test_model_facing_names() -> None:
    assert tool_name("github", "create_issue") == "github__create_issue"
    assert tool_name("my server", "a.b/c") == "my_server__a_b_c"


async def test_stdio_tools_are_listed_and_called() -> None:
    tools = by_name(await load_mcp_tools([STDIO]))
    assert set(tools) == {"echo__echo", "echo__add", "echo__fail", "echo__slow", "echo__shout_loud"}
    echo = tools["echo__echo"]
    assert isinstance(echo, Invocable) and not echo.inline
    assert echo.description == "Echo the text back."
    assert echo.parameters["properties"]["text"]["type"] == "string" and echo.parameters["required"] == [
        "text"
    ]
    assert echo.origin == "MCP server 'echo'"
    assert await echo.invoke({"text": "hi"}) == "echo: hi"
    assert await tools["echo__add"].invoke({"a": 2, "b": 3}) == "5"
    assert await tools["echo__shout_loud"].invoke({"text": "hey"}) == "HEY"  # called by its original name


async def test_mcp_failures_become_tool_errors() -> None:
    tools = by_name(await load_mcp_tools([STDIO]))
    with pytest.raises(ToolError, match=r"MCP tool .fail. of server .echo. failed: .*nope"):
        await tools["echo__fail"].invoke({"message": "nope"})
    with pytest.raises(ToolError, match="MCP tool 'add' of server 'echo' failed"):
        await tools["echo__add"].invoke({"a": "not a number"})
    slow = tools["echo__slow"]
    slow.timeout = 0.3
    with pytest.raises(ToolError, match=re.escape("timed out after 0.3 s")):
        await slow.invoke({"seconds": 5})


async def test_a_server_that_cannot_start_fails_clearly() -> None:
    broken = McpServer(name="ghost", command="/nonexistent/mcp-server")
    with pytest.raises(ConfigurationError, match="MCP server 'ghost': could not list its tools"):
        await load_mcp_tools([broken])
    orphan = McpTool(McpConnection(broken), "anything", "d", {"type": "object"})
    with pytest.raises(ToolError, match="MCP server 'ghost' failed on 'anything'"):
        await orphan.invoke({})


async def test_names_must_be_unique_across_servers_and_existing_tools() -> None:
    @tool
    def echo__echo(text: str) -> str:
        """Mine."""
        return text

    with pytest.raises(ConfigurationError, match="MCP server 'echo' offers 'echo__echo'"):
        await load_mcp_tools([STDIO], existing=[*builtin_tools(), echo__echo])


async def test_streamable_http_servers_with_headers() -> None:
    seen: list[dict[str, str]] = []
    app = build().streamable_http_app()

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    async with serve_in_background(recording) as base:
        server = McpServer(name="web", url=f"{base}/mcp", headers={"authorization": "Bearer t0ken"})
        tools = by_name(await load_mcp_tools([server]))
        assert "web__echo" in tools
        assert await tools["web__echo"].invoke({"text": "over http"}) == "echo: over http"
    assert seen and all(h.get("authorization") == "Bearer t0ken" for h in seen)


def test_settings_parse_into_servers() -> None:
    settings = Settings.from_env(
        {"STEPAGENT_MCP_SERVERS": f'[{{"name": "echo", "command": "{sys.executable}", "args": ["{ECHO}"]}}]'}
    )
    assert settings.mcp_servers == (STDIO,)


def test_the_input_wait_setting() -> None:
    assert Settings.from_env({}).mcp_input_wait == 120.0
    assert Settings.from_env({"STEPAGENT_MCP_INPUT_WAIT": "5"}).mcp_input_wait == 5.0
    assert Settings.from_env({"STEPAGENT_MCP_INPUT_WAIT": "0"}).mcp_input_wait == 0.0
    for bad in ("-1", "soon", "90000"):
        with pytest.raises(
            ConfigurationError, match=r"STEPAGENT_MCP_INPUT_WAIT='.*' is invalid: expected seconds"
        ):
            Settings.from_env({"STEPAGENT_MCP_INPUT_WAIT": bad})
