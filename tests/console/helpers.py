"""Shared by the console tests: the scripted agent they drive, and a console on a deployment-shaped stack.

The script (``SCRIPT``) covers what the console shows: a RAP tool call (the demo server's ``get_time``), a
child thread that reports and closes, a question (``pick_color``), a sign-in link (``connect_account``)
and a plain reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from stepagent.client import Client
from stepagent.console.app import ConsoleState, build_app
from stepagent.console.dead_letters import DeadLetters
from stepagent.providers.factory import make_provider
from tests.client.deployment import Deployment, deployment
from tests.conftest import aws_client
from tests.integration.aws_helpers import script_file

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "^plan",
            "on": ["user"],
            "reply": [
                {"text": "Let me check the time."},
                {"tool_call": {"name": "get_time", "arguments": {}}},
            ],
        },
        {
            "when": "UTC$",
            "on": ["tool_result"],
            "reply": [
                {"text": "Spawning a helper."},
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "count to three", "child_of": "{thread_stack}"},
                    }
                },
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "one two three"}}}],
        },
        {
            "when": "Report sent to parent",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "counted"},
                    }
                }
            ],
        },
        {"when": "has shut down", "reply": [{"text": "Child finished."}]},
        {"when": "Report from child thread: one two three", "reply": [{"text": "Got the report."}]},
        {"when": "color", "on": ["user"], "reply": [{"tool_call": {"name": "pick_color", "arguments": {}}}]},
        {"when": "picked blue", "reply": [{"text": "Blue it is."}]},
        {"when": "picked", "reply": [{"text": "Another color."}]},
        {
            "when": "connect",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "connect_account", "arguments": {}}}],
        },
        {"when": "hello", "on": ["user"], "reply": [{"text": "Hello back, friend."}]},
        {
            "when": "nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 3600}}}],
        },
    ],
    "default": [{"text": "ok"}],
}


def scripted_model() -> Any:
    return make_provider(f"scripted:{script_file(SCRIPT)}")


@dataclass
class ConsoleStack:
    deployment: Deployment
    client: Client
    state: ConsoleState
    http: httpx.AsyncClient
    sqs: Any

    async def post(self, url: str, data: dict[str, Any], *, ajax: bool = True) -> httpx.Response:
        headers = {"X-Requested-With": "fetch"} if ajax else {}
        return await self.http.post(url, data={**data, "csrf": self.state.csrf}, headers=headers)


@asynccontextmanager
async def console_stack(
    model: Any = None, *, mcp_servers: tuple[Any, ...] = ()
) -> AsyncIterator[ConsoleStack]:
    """A deployment running ``model`` (default: :data:`SCRIPT`; ``mcp_servers``: its MCP servers), an open
    client, and the console's app behind an in-process HTTP client (no socket)."""
    async with AsyncExitStack() as stack:
        d = await stack.enter_async_context(
            deployment(model if model is not None else scripted_model(), mcp_servers=mcp_servers)
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        sqs = await stack.enter_async_context(aws_client("sqs"))
        state = ConsoleState(client, DeadLetters(sqs, d.settings), header="test stack")
        transport = httpx.ASGITransport(app=build_app(state))
        http = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")
        )
        yield ConsoleStack(d, client, state, http, sqs)
