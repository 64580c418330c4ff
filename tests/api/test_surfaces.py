"""One set of facts on every surface: what the HTTP API streams is what the output queue carries (the typed
answer, the bill, the cache tokens), a refused decision reaches every surface with its call, and a stream
asked for one message's turn shows exactly that turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx

from stepagent.api.auth import ApiAuthSettings
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.providers.factory import make_provider
from tests.api.helpers import ApiStack, api_stack, new_thread
from tests.api.test_events import output_events, read_stream, settle
from tests.client.deployment import deployment
from tests.console.helpers import scripted_model
from tests.integration.aws_helpers import script_file

NONE = ApiAuthSettings(mode="none")
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
}
SCRIPT = {
    "rules": [
        # The first answer fails the schema; the model's second answer (after the feedback) fits it.
        {"when": "did not match|schema", "reply": [{"output": {"city": "Paris", "temp_c": 14}}]},
        {"when": "weather", "reply": [{"text": "It is nice."}]},
    ],
    "default": [{"text": "Hello."}],
}


@asynccontextmanager
async def priced_stack(script: dict[str, Any], **settings: str) -> AsyncIterator[ApiStack]:
    """A deployment running ``script`` with a price for its model and ``settings``, and the API over it."""
    model = make_provider(f"scripted:{script_file(script)}")
    prices = {model.info.name: {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}}
    async with AsyncExitStack() as stack:
        d = await stack.enter_async_context(
            deployment(model, agent_settings=settings, prices=json.dumps(prices))
        )
        client = await stack.enter_async_context(Client(d.settings, poll_interval=0.05))
        url = await stack.enter_async_context(open_api(client, NONE, port=0))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield ApiStack(d, client, url, http)


async def test_the_api_stream_carries_turn_complete_as_the_output_queue_does_and_wait_returns_the_output() -> (
    None
):
    async with priced_stack(SCRIPT, STEPAGENT_OUTPUT_SCHEMA=json.dumps(WEATHER)) as api:
        thread = new_thread("weather")
        async with Client(api_url=api.url, token=None) as remote:
            message_id = await remote.send(thread, "what is the weather?")
            assert await remote.wait(thread, message_id, timeout=60) == {"city": "Paris", "temp_c": 14}
        streamed, ended = await read_stream(api.http, f"/v1/threads/{thread}/events")
        assert ended
        queued = [e for e in await output_events(api) if e["root_thread_id"] == thread]
        [turn] = [e.data for e in streamed if e.event == "turn_complete"]
        [published] = [e for e in queued if e["type"] == "turn_complete"]
        assert turn == published
        assert turn["output"] == {"city": "Paris", "temp_c": 14}
        assert set(turn["usage"]) == {
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "cost_usd",
        }
        assert turn["usage"]["cost_usd"] > 0
        # Every committed event the queue carried is streamed with the same keys and values.
        committed = [e.data for e in streamed if e.event != "text_delta"]
        assert committed == [e for e in queued if e["type"] in {x["type"] for x in committed}]


async def test_a_stream_for_a_message_shows_exactly_the_turn_it_began_even_opened_before_the_worker_took_it() -> (
    None
):
    async with api_stack(scripted_model(), NONE) as api:
        thread = new_thread("demo")
        first = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "plan the day"})
        assert first.status_code == 202
        await asyncio.wait_for(settle(api, thread), 60)  # a turn with a tool and a child, all done
        before = [e for e in await output_events(api) if e["root_thread_id"] == thread]
        assert len({e["thread_id"] for e in before}) == 2
        second = await api.http.post(f"/v1/threads/{thread}/messages", json={"text": "hello"})
        message_id = second.json()["message_id"]
        streamed, ended = await asyncio.wait_for(
            read_stream(api.http, f"/v1/threads/{thread}/events?message_id={message_id}"), 60
        )
        assert ended
        events = [e.data for e in streamed if e.event != "text_delta"]
        assert [(e["thread_id"], e["type"], e.get("text")) for e in events] == [
            (thread, "text", "Hello back, friend."),
            (thread, "turn_complete", None),
        ]
        # The same events, with the same values, as the output queue carried for that turn.
        await asyncio.wait_for(settle(api, thread), 60)
        queued = [e for e in await output_events(api) if e["root_thread_id"] == thread]
        assert events == queued
        # A client waiting for its message over the API follows that turn only.
        async with Client(api_url=api.url, token=None) as remote:
            third = await remote.send(thread, "hello")
            assert await remote.wait(thread, third, timeout=60) is None
