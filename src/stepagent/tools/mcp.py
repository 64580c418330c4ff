"""MCP server tools through the official ``mcp`` SDK (stdio and streamable HTTP).

``STEPAGENT_MCP_SERVERS`` lists the servers (:class:`~stepagent.tools.mcp_config.McpServer`). At start,
:func:`load_mcp_tools` lists each server's tools and offers them to the model as
``<server name>__<tool name>`` (characters model APIs reject become ``_``; the original name is kept for
the call).

An :class:`McpTool` is asynchronous, like a function tool: ``execute`` hands the call to the context's
function runner (the tool runner Lambda in AWS, :class:`~stepagent.tools.functions.InProcessFunctionRunner`
locally), which calls :meth:`McpTool.invoke`. ``invoke`` raises only
:class:`~stepagent.errors.ToolError` for anything the model should see: an ``isError`` result (with the
server's text), a protocol error, a server that cannot be started or reached, or the timeout.

Connections: one session per invocation — start (stdio: spawn the process), initialise, call, close.
That costs a process start or an HTTP handshake per call, and buys what Lambda needs: nothing lives
across invocations (a frozen Lambda cannot keep a subprocess or an SSE stream healthy), no session can go
stale, and concurrent calls never share a session.
"""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO, cast

from stepagent.errors import ConfigurationError, ToolError
from stepagent.messages import ToolResult
from stepagent.tools.base import Tool, ToolContext
from stepagent.tools.mcp_config import McpServer

log = logging.getLogger(__name__)

SEPARATOR = "__"
DEFAULT_TIMEOUT = 60.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64


def tool_name(server: str, tool: str) -> str:
    """The model-facing name ``<server>__<tool>``, with characters model APIs reject replaced by ``_``."""
    return _UNSAFE.sub("_", f"{server}{SEPARATOR}{tool}")


def _describe(exc: BaseException) -> str:
    # anyio task groups wrap failures in exception groups: show the first real cause.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass(slots=True)
class McpConnection:
    """How to reach one server; :meth:`session` opens a fresh, initialised ``mcp.Client``."""

    server: McpServer
    errlog: TextIO | None = None

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        server = self.server
        if server.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=server.command, args=list(server.args), env=dict(server.env)
            )
            # A server's stderr is its log; in Lambda it would interleave with ours, so it is kept only on
            # request. The SDK hands ``errlog`` to the subprocess as its stderr, where DEVNULL is valid.
            errlog = self.errlog if self.errlog is not None else cast(TextIO, subprocess.DEVNULL)
            return stdio_client(params, errlog=errlog)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        client = httpx2.AsyncClient(headers=dict(server.headers), timeout=httpx2.Timeout(30.0, read=300.0))
        return _owning(client, streamable_http_client(str(server.url), http_client=client))

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        from mcp import Client

        async with Client(self._transport()) as client:
            yield client


@asynccontextmanager
async def _owning(http_client: Any, transport: AbstractAsyncContextManager[Any]) -> AsyncIterator[Any]:
    """``transport``, closing the HTTP client it was given afterwards."""
    async with http_client, transport as streams:
        yield streams


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind} content omitted]")
    if not parts and result.structured_content is not None:
        import json

        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class McpTool(Tool):
    """One tool of an MCP server. Asynchronous: executed by the function runner through :meth:`invoke`."""

    def __init__(
        self,
        connection: McpConnection,
        remote_name: str,
        description: str,
        parameters: dict[str, Any],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.connection = connection
        self.remote_name = remote_name
        self.timeout = timeout
        setattr(self, "name", tool_name(connection.server.name, remote_name))  # noqa: B010
        setattr(self, "description", description)  # noqa: B010
        setattr(self, "parameters", parameters)  # noqa: B010

    def __repr__(self) -> str:
        return f"<McpTool {self.name!r}>"

    @property
    def origin(self) -> str:
        return f"MCP server {self.connection.server.name!r}"

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        if context.runner is None:
            raise ConfigurationError(
                f"no function runner configured: cannot dispatch MCP tool '{self.name}' (configure the tool runner)"
            )
        await context.runner.submit(self.name, arguments, context)
        return None

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call the tool on a fresh session; the result's text, or ``ToolError``."""
        server = self.connection.server.name
        try:
            if self.timeout is None:
                result = await self._call(dict(arguments))
            else:
                result = await asyncio.wait_for(self._call(dict(arguments)), self.timeout)
        except TimeoutError:
            raise ToolError(
                f"MCP tool '{self.remote_name}' of server '{server}' timed out after {self.timeout:g} s"
            ) from None
        except ToolError:
            raise
        except Exception as exc:  # spawn failures, protocol errors, HTTP errors (often in exception groups)
            raise ToolError(
                f"MCP server '{server}' failed on '{self.remote_name}': {_describe(exc)}"
            ) from None
        text = _result_text(result)
        if result.is_error:
            raise ToolError(
                f"MCP tool '{self.remote_name}' of server '{server}' failed: {text or 'no details'}"
            )
        return text

    async def _call(self, arguments: dict[str, Any]) -> Any:
        async with self.connection.session() as client:
            return await client.call_tool(self.remote_name, arguments)


async def list_server_tools(connection: McpConnection, *, list_timeout: float = 30.0) -> list[McpTool]:
    """The tools of one server (all pages). Raises ``ConfigurationError`` naming the server."""
    name = connection.server.name
    try:
        async with asyncio.timeout(list_timeout), connection.session() as client:
            listed: list[Any] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
    except Exception as exc:
        raise ConfigurationError(f"MCP server {name!r}: could not list its tools: {_describe(exc)}") from None
    tools = []
    for remote in listed:
        made = McpTool(
            connection, remote.name, remote.description or remote.name, _schema(remote.input_schema)
        )
        if len(made.name) > _MAX_NAME:
            log.warning(
                "MCP tool %r of %r skipped: %r is over %d characters", remote.name, name, made.name, _MAX_NAME
            )
            continue
        tools.append(made)
    return tools


def _schema(raw: Any) -> dict[str, Any]:
    schema = dict(raw) if isinstance(raw, dict) else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


async def load_mcp_tools(
    servers: Sequence[McpServer], *, existing: Iterable[Tool] = (), errlog: TextIO | None = None
) -> list[McpTool]:
    """Every configured server's tools, listed concurrently. A server that cannot be listed, or a name
    clash (with another server's tool or an ``existing`` one), is a ``ConfigurationError``."""
    connections = [McpConnection(server, errlog) for server in servers]
    listed = await asyncio.gather(*(list_server_tools(c) for c in connections))
    owners = {
        t.name: str(getattr(t, "origin", None) or "a built-in or STEPAGENT_TOOLS tool") for t in existing
    }
    tools: list[McpTool] = []
    for server_tools in listed:
        for tool in server_tools:
            if tool.name in owners:
                raise ConfigurationError(
                    f"tool name clash: {tool.origin} offers {tool.name!r}, which {owners[tool.name]} already provides"
                )
            owners[tool.name] = tool.origin
            tools.append(tool)
    return tools
