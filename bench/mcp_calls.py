"""MCP requests per step: what a tool call costs on the wire before and after stateless-first.

For each protocol era, a loopback server built with the official SDK counts the HTTP requests it
receives while the tool runner's :class:`~stepagent.tools.mcp.McpTool` makes ``calls`` calls (one per
step, as the worker dispatches them), after the cold start's listing. The baseline is what a fresh
SDK ``Client`` per call does (the previous behaviour): probe ``server/discover``, then — for an older
server — the ``initialize`` handshake, the call, and a ``tools/list`` the SDK makes to check the result.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp import load_mcp_tools
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.mcp_session import forget_all


def _server() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return server.streamable_http_app()


def _counting(app: Any, seen: list[str], legacy: bool) -> Any:
    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"")
        method = str(json.loads(body).get("method", "")) if body else ""
        seen.append(f"{scope['method']} {method}".strip())
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        version = headers.get("mcp-protocol-version")
        if legacy and version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # a server from before 2026-07-28 answers the stateless probe with a 400 outside a session
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return dict(await receive())
            sent = True
            return dict(message)

        await app(scope, replay, send)

    return serve


async def _per_call_baseline(url: str, calls: int) -> None:
    from mcp import Client

    for n in range(calls):
        async with Client(url, cache=None) as client:  # the previous behaviour: a fresh client per call
            await client.call_tool("echo", {"text": str(n)})


async def mcp_call_costs(quick: bool) -> dict[str, Any]:
    calls = 3 if quick else 10
    out: dict[str, Any] = {"calls": calls}
    for era, legacy in (("2026-07-28", False), ("2025-11-25 (handshake)", True)):
        forget_all()
        seen: list[str] = []
        async with serve_in_background(_counting(_server(), seen, legacy)) as base:
            url = f"{base}/mcp"
            await _per_call_baseline(url, calls)
            before = list(seen)
            seen.clear()
            tools = {t.name: t for t in await load_mcp_tools([McpServer(name="bench", url=url)])}
            cold = list(seen)
            seen.clear()
            for n in range(calls):
                await tools["bench__echo"].invoke({"text": str(n)})
            after = list(seen)
        per_call_before = len(before) / calls
        per_call_after = len(after) / calls
        out[era] = {
            "requests_per_call_before": per_call_before,
            "requests_per_call_after": per_call_after,
            "saved_per_step": per_call_before - per_call_after,
            "tools_list_per_call_before": sum(r == "POST tools/list" for r in before) / calls,
            "tools_list_per_call_after": sum(r == "POST tools/list" for r in after) / calls,
            "discover_per_call_before": sum(r == "POST server/discover" for r in before) / calls,
            "discover_per_call_after": sum(r == "POST server/discover" for r in after) / calls,
            "cold_start_requests": len(cold),
            "one_call_after": after[: len(after) // calls],
        }
    forget_all()
    return out
