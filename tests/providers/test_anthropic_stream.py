"""Recorded Messages API streams (hand-written from the streaming documentation) parse into the expected
events, through the pure parser and through the provider's real HTTP path on a mock transport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from stepagent.errors import ProviderError
from stepagent.history_items import UserItem
from stepagent.messages import TextContent, ToolCall
from stepagent.providers.anthropic import AnthropicProvider, AnthropicStreamParser
from stepagent.providers.base import (
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningComplete,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    Usage,
)
from stepagent.providers.sse import SSEDecoder

FIXTURES = Path(__file__).parent / "fixtures"
INFO = ModelInfo(
    "claude-sonnet-4-6", context_window=200_000, max_output_tokens=64_000, supports_image_input=True
)
REQUEST = ModelRequest(system="s", history=[UserItem(TextContent(text="hi"))], tools=[], model=INFO)


def parse(name: str) -> list[StreamEvent]:
    decoder = SSEDecoder()
    parser = AnthropicStreamParser()
    events: list[StreamEvent] = []
    for sse in decoder.feed((FIXTURES / name).read_bytes()) + decoder.close():
        events.extend(parser.feed(sse))
    events.extend(parser.finish())
    return events


def test_text_stream() -> None:
    assert parse("anthropic_text.sse") == [
        TextDelta("Hello"),
        TextDelta("!\u2028 raw 🧪"),
        Final(
            Usage(input_tokens=25, output_tokens=15),
            stop_reason="end_turn",
            response_id="msg_01",
            response_model="claude-sonnet-4-5",
        ),
    ]


def test_thinking_redacted_text_and_tool_use() -> None:
    events = parse("anthropic_thinking_tool.sse")
    assert events == [
        ReasoningDelta("The user wants the weather 🌦"),
        ReasoningDelta(" in Paris\u2028now."),
        ReasoningComplete(
            text="The user wants the weather 🌦 in Paris\u2028now.",
            signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
        ),
        ReasoningComplete(
            text="", redacted="EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
        ),
        TextDelta("Checking the weather — 日本語 ok."),
        ToolCallDelta(name="get_weather"),
        ToolCallDelta(arguments_delta='{"location": "Par'),
        ToolCallDelta(arguments_delta='is 😀", "unit": "celsius"}'),
        ToolCallComplete(
            ToolCall(
                id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                name="get_weather",
                arguments={"location": "Paris 😀", "unit": "celsius"},
            )
        ),
        Final(
            Usage(input_tokens=472, output_tokens=89, cache_read_tokens=3000, cache_write_tokens=1200),
            stop_reason="tool_use",
            response_id="msg_02",
            response_model="claude-sonnet-4-5",
        ),
    ]


def test_error_event_is_classified() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("anthropic_error.sse")
    assert caught.value.retryable
    assert "overloaded_error" in str(caught.value) and "Overloaded" in str(caught.value)


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [("overloaded_error", True), ("api_error", True), ("rate_limit_error", True), ("something_new", True),
     ("invalid_request_error", False), ("authentication_error", False), ("permission_error", False)],
)  # fmt: skip
def test_error_event_types(kind: str, retryable: bool) -> None:
    from stepagent.providers.sse import SSEEvent

    parser = AnthropicStreamParser()
    data = json.dumps({"type": "error", "error": {"type": kind, "message": "m"}})
    with pytest.raises(ProviderError) as caught:
        parser.feed(SSEEvent("error", data))
    assert caught.value.retryable is retryable


def test_stream_that_ends_before_message_stop_is_a_retryable_cut() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("anthropic_cut.sse")
    assert caught.value.retryable
    assert "message_stop" in str(caught.value)


def test_invalid_tool_json_is_retryable() -> None:
    from stepagent.providers.sse import SSEEvent

    parser = AnthropicStreamParser()
    parser.feed(SSEEvent("content_block_start", '{"type":"content_block_start","index":0,'
                         '"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}'))  # fmt: skip
    parser.feed(SSEEvent("content_block_delta", '{"type":"content_block_delta","index":0,'
                         '"delta":{"type":"input_json_delta","partial_json":"{\\"a\\": "}}'))  # fmt: skip
    with pytest.raises(ProviderError) as caught:
        parser.feed(SSEEvent("content_block_stop", '{"type":"content_block_stop","index":0}'))
    assert caught.value.retryable


# ---- through the provider's HTTP path ---------------------------------------------------------------------


def provider(handler: httpx.MockTransport) -> AnthropicProvider:
    client = httpx.AsyncClient(transport=handler)
    return AnthropicProvider("claude-sonnet-4-6", api_key="k", info=INFO, http_client=client)


async def collect(p: AnthropicProvider) -> list[StreamEvent]:
    return [event async for event in p.stream(REQUEST)]


async def test_http_stream_from_fixture() -> None:
    body = (FIXTURES / "anthropic_thinking_tool.sse").read_bytes()
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body))
    events = await collect(provider(transport))
    assert events == parse("anthropic_thinking_tool.sse")


class _CutStream(httpx.AsyncByteStream):
    """Sends a prefix of a stream, then fails like a dropped connection."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


async def test_connection_cut_mid_stream_is_retryable() -> None:
    raw = (FIXTURES / "anthropic_text.sse").read_bytes()
    body = raw[: raw.index(b'"Hello"}}\n\n') + 20]  # the "Hello" event and part of the next one
    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=_CutStream(body)))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in provider(transport).stream(REQUEST):
            seen.append(event)
    assert caught.value.retryable
    assert "cut" in str(caught.value)
    assert seen == [TextDelta("Hello")]


async def test_clean_end_without_message_stop_is_retryable() -> None:
    body = (FIXTURES / "anthropic_cut.sse").read_bytes()
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(transport))
    assert caught.value.retryable


async def test_connection_error_before_response_is_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(ProviderError) as caught:
        await collect(provider(httpx.MockTransport(handler)))
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("status", "headers", "retryable", "retry_after"),
    [
        (429, {"retry-after": "7"}, True, 7.0),
        (529, {"retry-after-ms": "1500"}, True, 1.5),
        (500, {}, True, None),
        (400, {}, False, None),
        (401, {}, False, None),
        (403, {}, False, None),
        (404, {}, False, None),
    ],
)
async def test_http_errors(
    status: int, headers: dict[str, str], retryable: bool, retry_after: float | None
) -> None:
    body = b'{"type":"error","error":{"type":"some_error","message":"the API says why"}}'
    transport = httpx.MockTransport(lambda r: httpx.Response(status, headers=headers, content=body))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(transport))
    assert caught.value.retryable is retryable
    assert caught.value.status == status
    assert caught.value.retry_after == retry_after
    assert "the API says why" in str(caught.value)


async def test_provider_sends_to_base_url_with_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=(FIXTURES / "anthropic_text.sse").read_bytes())

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    p = AnthropicProvider(
        "claude-x", api_key="sk-1", info=INFO, base_url="http://proxy.local/anth/", http_client=client
    )
    await collect(p)
    assert str(seen[0].url) == "http://proxy.local/anth/v1/messages"
    assert seen[0].headers["x-api-key"] == "sk-1"
