"""The HTTP client's event stream reconnects after a dropped connection, from the last event id, through
the one backoff rule, and gives up after six failures in a row (httpx ``MockTransport``: real requests,
no server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from stepagent.backoff import Backoff
from stepagent.client.http import HttpBackend


@pytest.fixture(autouse=True)
def quick_reconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stepagent.client.http.RECONNECT_BACKOFF", Backoff(attempts=6, base=0.001))


def sse(*events: tuple[str, dict[str, object]]) -> bytes:
    return "".join(f"id: {token}\ndata: {json.dumps(event)}\n\n" for token, event in events).encode()


class Dropped(httpx.AsyncByteStream):
    """A response body that delivers ``data`` and then loses the connection."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        raise httpx.ReadError("connection reset")


async def test_a_dropped_stream_is_resumed_from_the_last_event_id() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Last-Event-ID"))
        if len(seen) == 1:
            first = sse(("t1", {"type": "text", "thread_id": "th", "text": "hi"}))
            return httpx.Response(200, stream=Dropped(first))
        if len(seen) in (2, 3):
            raise httpx.ConnectError("connection refused")
        done = {"type": "turn_complete", "thread_id": "th", "output": {"ok": True}}
        return httpx.Response(200, content=sse(("t2", done)))

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://api")
    api = HttpBackend("http://api", None, http=http)
    events = [event async for _, event in api._events("th", None, follow=True)]
    assert seen == [None, "t1", "t1", "t1"] and [e["type"] for e in events] == ["text", "turn_complete"]
    await http.aclose()


async def test_six_failed_connections_in_a_row_end_the_stream() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://api")
    with pytest.raises(httpx.ConnectError):
        await HttpBackend("http://api", None, http=http).wait("th", timeout=30)
    assert calls == 6
    await http.aclose()
