"""``Client.replies`` and ``Client.answer_input`` against a deployment-shaped stack (moto, the real worker
and tool runner behind Lambda-like event sources) with a real loopback MCP server whose tool asks a
question: the replies show the question as an ``input`` item and end while the call waits for the
person; the answer continues the call, and the next replies show the tool's real result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepagent.client import Client
from stepagent.providers.factory import make_provider
from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp_config import McpServer
from tests.client.deployment import deployment
from tests.mcp.fixtures.eras import Recorder, build, recording

SCRIPT = {
    "rules": [
        {
            "when": "delete",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "web__confirm_delete", "arguments": {"path": "a.txt"}}}],
        },
        {"when": "^deleted", "on": ["tool_result"], "reply": [{"text": "Done."}]},
    ],
    "default": [{"text": "ok"}],
}


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "older"])
async def test_replies_show_the_question_and_the_answer_continues_the_call(
    tmp_path: Path, legacy: bool
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    app = recording(build().streamable_http_app(), Recorder(), legacy=legacy)
    async with serve_in_background(app) as base:
        server = McpServer(name="web", url=f"{base}/mcp")
        async with (
            deployment(make_provider(f"scripted:{script}"), mcp_servers=(server,)) as d,
            Client(d.settings, poll_interval=0.05) as client,
        ):
            await client.send("conv-ask", "delete a.txt")
            first = [item async for item in client.replies("conv-ask", timeout=60)]
            [asked] = [i for i in first if i["kind"] == "input"]
            assert asked["text"] == "Why should I delete it?"
            assert asked.get("requested_schema", {}).get("required") == ["reason"]
            assert not any(i["kind"] == "tool_result" for i in first)

            await client.answer_input(
                asked["thread_id"], asked["tool_call_id"], "accept", {"reason": "it is old"}
            )
            second = [item async for item in client.replies("conv-ask", timeout=60)]
            texts = [(i["kind"], i.get("text")) for i in second if i["kind"] in ("tool_result", "assistant")]
            assert texts == [("tool_result", "deleted a.txt because it is old"), ("assistant", "Done.")]
