"""A stream opened while a call waits on the person — a second device, a new tab — is shown what they must
do to go on: the call's sign-in link (``oauth_required``), the same event with the same id as the output
queue and the first stream carried, until the call has its result; a tool's question (``input_required``)
until it is answered. Older notices (errors, refusals) are not replayed: history shows those. The
deployment-shaped stack (moto, the real worker and tool runner), with a tool that needs the user's sign-in
as in ``test_browser_signin`` and a real loopback MCP server that asks a question."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

from stepagent.api.auth import DevAuth
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.providers.factory import make_provider
from stepagent.rap.server import serve_in_background
from stepagent.stores.dynamodb.io import item_key
from stepagent.tools.mcp_config import McpServer
from tests.api.helpers import api_stack, new_thread
from tests.api.test_browser_signin import GOOD_URL, ConnectDrive, reply
from tests.api.test_events import read_stream
from tests.client.deployment import FunctionModel, deployment
from tests.client.test_elicitation_client import SCRIPT as ASKING
from tests.conftest import aws_client
from tests.mcp.fixtures.eras import Recorder, build, recording


def caught_up(sse: Any) -> bool:
    """The stream sent everything there was (its first poll) and has since been quiet: a heartbeat."""
    return sse.comment == "heartbeat"


async def test_a_stream_opened_while_a_sign_in_waits_shows_its_link_until_the_call_goes_on() -> None:
    dev = DevAuth.generate()
    tool = ConnectDrive()
    async with api_stack(FunctionModel(reply), dev.settings, tools=[tool], heartbeat_s=0.2) as api:
        api.http.headers["Authorization"] = f"Bearer {dev.token('ann')}"
        thread = new_thread("waits")
        events = f"/v1/threads/{thread}/events?follow=1"
        sent = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "connect my drive"})
        assert sent.status_code == 202

        first, _ = await read_stream(api.http, events, until=lambda e: e.event == "oauth_required")
        asked = first[-1].data
        assert asked["auth_url"] == GOOD_URL and asked["tool_call_id"] == "call-signin-good"

        # Another device opens the conversation while the sign-in waits: it is shown the link too.
        second, _ = await read_stream(api.http, events, until=caught_up)
        shown = [e.data for e in second if e.event == "oauth_required"]
        assert shown == [asked]  # the same event, the same event_id
        assert [e.event for e in second].index("oauth_required") > [e.event for e in second].index(
            "tool_call"
        )

        # The user signed in and the call went on: a fresh stream no longer asks.
        await tool.calls["call-signin-good"].send_result("connected: 3 files")
        await read_stream(
            api.http,
            events,
            until=lambda e: e.event == "text" and e.data["text"] == "Your drive is connected.",
        )
        third, _ = await read_stream(api.http, events, until=caught_up)
        assert [e.event for e in third if e.event == "oauth_required"] == []
        assert "Your drive is connected." in [e.data.get("text") for e in third]

        # Days later the call's answered-marker has expired (a TTL item): the thread's finished turn still
        # says nothing waits, so a fresh stream still does not ask.
        async with aws_client("dynamodb") as dynamodb:
            await dynamodb.delete_item(
                TableName=str(api.deployment.settings.state_table), Key=item_key(thread, "A#call-signin-good")
            )
        fourth, _ = await read_stream(api.http, events, until=caught_up)
        assert [e.event for e in fourth if e.event == "oauth_required"] == []


async def test_a_stream_opened_while_a_question_waits_shows_it_until_it_is_answered(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(ASKING))
    dev = DevAuth.generate()
    app = recording(build().streamable_http_app(), Recorder(), legacy=False)
    async with AsyncExitStack() as stack:
        base = await stack.enter_async_context(serve_in_background(app))
        server = McpServer(name="web", url=f"{base}/mcp")
        d = await stack.enter_async_context(
            deployment(make_provider(f"scripted:{script}"), mcp_servers=(server,))
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, dev.settings, port=0, heartbeat_s=0.2))
        http = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {dev.token('ann')}"}
            )
        )
        thread = new_thread("asks")
        events = f"/v1/threads/{thread}/events?follow=1"
        assert (
            await http.post(f"/v1/threads/{thread}/messages", json={"text": "delete a.txt"})
        ).status_code == 202
        first, _ = await read_stream(http, events, until=lambda e: e.event == "input_required")
        asked = first[-1].data

        second, _ = await read_stream(http, events, until=caught_up)
        assert [e.data for e in second if e.event == "input_required"] == [asked]

        answer = {
            "tool_call_id": asked["tool_call_id"],
            "action": "accept",
            "content": {"reason": "it is old"},
        }
        assert (await http.post(f"/v1/threads/{thread}/elicitations", json=answer)).status_code == 202
        await read_stream(http, events, until=lambda e: e.event == "text" and e.data["text"] == "Done.")
        third, _ = await read_stream(http, events, until=caught_up)
        assert [e for e in third if e.event == "input_required"] == []
