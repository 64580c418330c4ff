"""The HTTP client's items: the history the API serves is returned as it came (its outer shape checked),
and stream events become the client's items with the same keys the store-reading client gives them
(httpx ``MockTransport``: real requests, no server)."""

from __future__ import annotations

import httpx
import pytest

from stepagent.client.http import ApiRequestError, HttpBackend, item_of


def api_answering(body: object) -> tuple[HttpBackend, httpx.AsyncClient]:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/threads/th"
        return httpx.Response(200, json=body)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://api")
    return HttpBackend("http://api", None, http=http), http


async def test_the_history_is_the_apis_list_unchanged() -> None:
    items = [
        {"thread_id": "th", "order": 1, "kind": "user", "text": "hi"},
        {
            "thread_id": "th",
            "order": 2,
            "kind": "tool_call",
            "name": "t",
            "args": {"a": [1]},
            "tool_call_id": "c",
        },
    ]
    api, http = api_answering(items)
    assert await api.history("th") == items
    await http.aclose()


@pytest.mark.parametrize(
    "body",
    [
        {"items": []},
        [{"thread_id": "th", "kind": "user"}, "not an item"],
        [{"thread_id": 7, "kind": "user"}],
        [{"thread_id": "th", "kind": "no-such-kind"}],
    ],
)
async def test_a_history_that_is_not_a_list_of_items_is_a_clear_error(body: object) -> None:
    api, http = api_answering(body)
    with pytest.raises(ApiRequestError, match="history is not a JSON list of items"):
        await api.history("th")
    await http.aclose()


def test_stream_events_become_items_with_the_clients_keys() -> None:
    call = {
        "type": "tool_call",
        "event_id": "e",
        "thread_id": "th",
        "name": "t",
        "args": {},
        "tool_call_id": "c",
    }
    assert item_of(call) == {
        "thread_id": "th",
        "kind": "tool_call",
        "name": "t",
        "args": {},
        "tool_call_id": "c",
    }
    assert item_of({"type": "text", "thread_id": "th", "text": "hello", "metadata": {}}) == {
        "thread_id": "th",
        "kind": "assistant",
        "text": "hello",
    }
    assert item_of({"type": "error", "thread_id": "th", "message": "boom", "retrying": False}) == {
        "thread_id": "th",
        "kind": "error",
        "text": "boom",
        "retrying": False,
    }
    assert item_of({"type": "text_delta", "thread_id": "th", "text": "he"}) == {
        "thread_id": "th",
        "kind": "partial",
        "delta": "he",
    }
    assert item_of({"type": "turn_complete", "thread_id": "th"}) is None
    # A value without its type is left out rather than passed on as if it had it.
    assert item_of({"type": "tool_call", "thread_id": "th", "name": 3, "args": [], "tool_call_id": None}) == {
        "thread_id": "th",
        "kind": "tool_call",
    }
