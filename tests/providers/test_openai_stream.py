"""Recorded Chat Completions streams (hand-written from the streaming documentation) parse into the
expected events, through the pure parser and through the provider's HTTP path on a mock transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from stepagent.errors import ProviderError
from stepagent.history_items import UserItem
from stepagent.messages import TextContent, ToolCall
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
from stepagent.providers.openai_compat import OpenAIProvider, OpenAIStreamParser
from stepagent.providers.sse import SSEDecoder, SSEEvent

FIXTURES = Path(__file__).parent / "fixtures"
INFO = ModelInfo("gpt-4.1", context_window=1_047_576, max_output_tokens=32_768, supports_image_input=True)
REQUEST = ModelRequest(system="s", history=[UserItem(TextContent(text="hi"))], tools=[], model=INFO)


def parse(name: str) -> list[StreamEvent]:
    decoder = SSEDecoder()
    parser = OpenAIStreamParser()
    events: list[StreamEvent] = []
    for sse in decoder.feed((FIXTURES / name).read_bytes()) + decoder.close():
        events.extend(parser.feed(sse))
    events.extend(parser.finish())
    return events


def test_text_stream_with_cached_usage() -> None:
    assert parse("openai_text.sse") == [
        TextDelta("Hello 😀"),
        TextDelta(" world\u2028!"),
        Final(
            Usage(input_tokens=176, output_tokens=7, cache_read_tokens=1024),
            stop_reason="stop",
            response_id="chatcmpl-1",
            response_model="gpt-4o-2024-08-06",
        ),
    ]


def test_tool_call_with_streamed_arguments() -> None:
    assert parse("openai_tool.sse") == [
        ToolCallDelta(name="get_weather"),
        ToolCallDelta(arguments_delta='{"loc'),
        ToolCallDelta(arguments_delta='ation":"Paris 🇫🇷"}'),
        ToolCallComplete(ToolCall(id="call_abc123", name="get_weather", arguments={"location": "Paris 🇫🇷"})),
        Final(
            Usage(input_tokens=80, output_tokens=17),
            stop_reason="tool_calls",
            response_id="chatcmpl-2",
            response_model="gpt-4.1",
        ),
    ]


def test_compatible_server_reasoning_without_done_marker() -> None:
    # A compatible server that streams reasoning_content and ends without [DONE] after finish_reason.
    assert parse("openai_reasoning_compat.sse") == [
        ReasoningDelta("Think"),
        ReasoningDelta("ing."),
        TextDelta("Answer"),
        ReasoningComplete("Thinking."),
        Final(None, stop_reason="stop", response_id="c3", response_model="deepseek-reasoner"),
    ]


def test_error_chunk_is_classified() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("openai_error.sse")
    assert caught.value.retryable
    assert "server_error" in str(caught.value)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [('{"type":"server_error","message":"m"}', True), ('{"type":"rate_limit_exceeded","message":"m"}', True),
     ('{"type":"invalid_request_error","message":"m"}', False),
     ('{"type":null,"code":"context_length_exceeded","message":"m"}', False)],
)  # fmt: skip
def test_error_chunk_types(error: str, retryable: bool) -> None:
    with pytest.raises(ProviderError) as caught:
        OpenAIStreamParser().feed(SSEEvent("message", '{"error":' + error + "}"))
    assert caught.value.retryable is retryable


def test_cut_before_finish_reason_is_retryable() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("openai_cut.sse")
    assert caught.value.retryable


def test_parallel_calls_complete_in_index_order() -> None:
    parser = OpenAIStreamParser()
    chunks = [
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"two","arguments":"{}"}}]}}]}',
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"one","arguments":""}}]}}]}',
        '{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    ]
    events = [e for c in chunks for e in parser.feed(SSEEvent("message", c))]
    events += parser.feed(SSEEvent("message", "[DONE]"))
    completes = [e.call for e in events if isinstance(e, ToolCallComplete)]
    assert [(c.id, c.name, c.arguments) for c in completes] == [("a", "one", {}), ("b", "two", {})]


# ---- through the provider's HTTP path ---------------------------------------------------------------------


def provider(transport: httpx.MockTransport, base_url: str | None = None) -> OpenAIProvider:
    client = httpx.AsyncClient(transport=transport)
    return OpenAIProvider("gpt-4.1", api_key="k", info=INFO, base_url=base_url, http_client=client)


async def collect(p: OpenAIProvider) -> list[StreamEvent]:
    return [event async for event in p.stream(REQUEST)]


async def test_http_stream_from_fixture() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=(FIXTURES / "openai_tool.sse").read_bytes())

    events = await collect(provider(httpx.MockTransport(handler), "http://localhost:11434/v1"))
    assert events == parse("openai_tool.sse")
    assert str(seen[0].url) == "http://localhost:11434/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer k"


class _CutStream(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data
        raise httpx.ReadError("connection reset by peer")


async def test_connection_cut_mid_stream_is_retryable() -> None:
    raw = (FIXTURES / "openai_text.sse").read_bytes()
    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=_CutStream(raw[:900])))
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in provider(transport).stream(REQUEST):
            seen.append(event)
    assert caught.value.retryable
    assert seen and all(isinstance(e, TextDelta) for e in seen)


@pytest.mark.parametrize(
    ("status", "headers", "retryable", "retry_after"),
    [(429, {"retry-after-ms": "250", "retry-after": "1"}, True, 0.25), (503, {"Retry-After": "3"}, True, 3.0),
     (400, {}, False, None), (401, {}, False, None), (404, {}, False, None)],
)  # fmt: skip
async def test_http_errors(
    status: int, headers: dict[str, str], retryable: bool, retry_after: float | None
) -> None:
    body = b'{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}'
    transport = httpx.MockTransport(lambda r: httpx.Response(status, headers=headers, content=body))
    with pytest.raises(ProviderError) as caught:
        await collect(provider(transport))
    assert caught.value.retryable is retryable
    assert caught.value.retry_after == retry_after
    assert "Incorrect API key provided" in str(caught.value)
