"""One set of facts on every surface: what the HTTP API streams is what the output queue carries (the typed
answer, the bill, the cache tokens), a refused decision reaches every surface with its call, and a stream
asked for one message's turn shows exactly that turn."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx

from stepagent.api.auth import ApiAuthSettings
from stepagent.api.server import open_api
from stepagent.client import Client
from stepagent.providers.factory import make_provider
from tests.api.helpers import ApiStack, new_thread
from tests.api.test_events import output_events, read_stream
from tests.client.deployment import deployment
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
