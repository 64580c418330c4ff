"""The seam under ``Client``: one client, its calls handed to a backend (the stores, or the HTTP API).

Over HTTP, what the API has no route for is refused with a ``ClientError`` saying so (not an attribute
error from deep inside); leaving ``replies`` early lets the HTTP stream go at once, not when the garbage
collector gets to it; ``SyncClient`` blocks on the same calls through its portal thread, its errors
raised in the caller's thread, and ``close`` ends that thread. httpx ``MockTransport``: real requests, no
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator

import httpx
import pytest

from stepagent.client import Client, ClientError, SyncClient
from stepagent.client.http import HttpBackend


async def test_a_client_over_http_says_what_the_api_has_no_route_for() -> None:
    async with Client(api_url="http://api.invalid", token=None) as client:
        assert await client.usage("th") is None
        refused = [
            client.cursor("th"),
            client.idle("th"),
            client.pending_approvals("th"),
            client.pending_choices("th"),
            client.answer_choice("th", None, 0),
        ]
        for call in refused:
            with pytest.raises(ClientError, match=r"is not available over the HTTP API \(api_url\)"):
                await call
        for store_only in ("conversation", "state", "settings", "stores", "sender", "reader"):
            with pytest.raises(ClientError, match=r"a client over the HTTP API \(api_url\) has no stores"):
                getattr(client, store_only)


class HeldStream(httpx.AsyncByteStream):
    """An event stream that sends one event and then stays open (``follow``), noting when it is closed."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        event = {"type": "text", "thread_id": "th", "text": "hi"}
        yield f"id: t1\ndata: {json.dumps(event)}\n\n".encode()
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


async def test_leaving_replies_early_over_http_lets_the_stream_go_at_once() -> None:
    stream = HeldStream()
    mock = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=stream)),
        base_url="http://api",
    )
    async with Client(api_url="http://api", token=None) as client:
        client._backend = HttpBackend("http://api", None, http=mock)
        async with contextlib.aclosing(client.replies("th", follow=True)) as items:  # type: ignore[type-var]
            first = await anext(items)
        assert first == {"thread_id": "th", "kind": "assistant", "text": "hi"}
        assert stream.closed
    await mock.aclose()


def test_the_sync_client_raises_in_the_callers_thread_and_close_ends_its_loop_thread() -> None:
    client = SyncClient(api_url="http://api.invalid")
    with client:
        with pytest.raises(ClientError, match=r"idle\(\) is not available over the HTTP API"):
            client.idle("th")
        assert any(t.name == "stepagent-client" for t in threading.enumerate())
    assert not any(t.name == "stepagent-client" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="this SyncClient is closed"):
        client.history("th")
