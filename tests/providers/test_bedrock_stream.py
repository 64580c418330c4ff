"""Recorded ConverseStream event sequences (hand-written from the API reference) parse into the expected
events: through the pure parser, and end to end through aioboto3 against a loopback endpoint that answers
with the binary AWS event-stream encoding. The provider keeps one client per event loop: later calls reuse
its connection, concurrent first calls open it once, and a new loop gets a client of its own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aioboto3
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
from stepagent.providers.bedrock import BedrockProvider, BedrockStreamParser
from tests.providers.bedrock_stub import BedrockStub, load_events, parsed, serve

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
INFO = ModelInfo(MODEL, context_window=200_000, max_output_tokens=64_000, supports_image_input=True)
REQUEST = ModelRequest(system="s", history=[UserItem(TextContent(text="hi"))], tools=[], model=INFO)
SESSION = aioboto3.Session(
    region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
)


def parse(name: str) -> list[StreamEvent]:
    parser = BedrockStreamParser()
    events: list[StreamEvent] = []
    for event in load_events(name):
        events.extend(parser.feed(parsed(event)))
    events.extend(parser.finish())
    return events


TEXT_EVENTS = [
    TextDelta("Hello 😀"),
    TextDelta(" world\u2028!"),
    Final(
        Usage(input_tokens=30, output_tokens=8, cache_read_tokens=1000, cache_write_tokens=500), "end_turn"
    ),
]
TOOL_EVENTS = [
    ReasoningDelta("Need the "),
    ReasoningDelta("weather 🌦."),
    ReasoningComplete("Need the weather 🌦.", signature="ErcBCkgIBxABGAIiQGsig"),
    ReasoningComplete("", redacted="AAECAwQF"),
    TextDelta("Let me check."),
    ToolCallDelta(name="get_weather"),
    ToolCallDelta(arguments_delta='{"location": "Pa'),
    ToolCallDelta(arguments_delta='ris"}'),
    ToolCallComplete(
        ToolCall(id="tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", name="get_weather", arguments={"location": "Paris"})
    ),
    Final(Usage(input_tokens=120, output_tokens=40), "tool_use"),
]


def test_text_stream_with_cache_usage() -> None:
    assert parse("bedrock_text.jsonl") == TEXT_EVENTS


def test_reasoning_redacted_and_tool_use() -> None:
    assert parse("bedrock_reasoning_tool.jsonl") == TOOL_EVENTS


def test_exception_event_is_classified() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("bedrock_error.jsonl")
    assert caught.value.retryable
    assert "ThrottlingException" in str(caught.value)


def test_validation_exception_event_is_not_retryable() -> None:
    with pytest.raises(ProviderError) as caught:
        BedrockStreamParser().feed({"validationException": {"message": "bad"}})
    assert not caught.value.retryable


def test_end_before_message_stop_is_a_retryable_cut() -> None:
    with pytest.raises(ProviderError) as caught:
        parse("bedrock_cut.jsonl")
    assert caught.value.retryable


def test_message_stop_without_metadata_still_finishes() -> None:
    parser = BedrockStreamParser()
    parser.feed({"contentBlockDelta": {"delta": {"text": "x"}, "contentBlockIndex": 0}})
    parser.feed({"messageStop": {"stopReason": "end_turn"}})
    assert parser.finish() == [Final(None, "end_turn")]


# ---- end to end through aioboto3 -------------------------------------------------------------------------


@pytest.fixture
def stub() -> Iterator[BedrockStub]:
    yield from serve()


_made: list[BedrockProvider] = []


@pytest.fixture(autouse=True)
async def close_providers() -> AsyncIterator[None]:
    """A provider keeps its client for its loop; each test's are closed on that test's loop."""
    yield
    while _made:
        await _made.pop().aclose()


def provider(stub_url: str) -> BedrockProvider:
    made = BedrockProvider(MODEL, info=INFO, region="us-east-1", endpoint_url=stub_url, session=SESSION)
    _made.append(made)
    return made


async def collect(p: BedrockProvider) -> list[StreamEvent]:
    return [event async for event in p.stream(REQUEST)]


@pytest.mark.parametrize(
    ("name", "expected"), [("bedrock_text.jsonl", TEXT_EVENTS), ("bedrock_reasoning_tool.jsonl", TOOL_EVENTS)]
)
async def test_binary_event_stream_end_to_end(
    stub: BedrockStub, name: str, expected: list[StreamEvent]
) -> None:
    stub.events = load_events(name)
    assert await collect(provider(stub.url)) == expected
    assert stub.paths == [f"/model/{MODEL.replace(':', '%3A')}/converse-stream"]


async def test_exception_event_end_to_end(stub: BedrockStub) -> None:
    stub.events = load_events("bedrock_error.jsonl")
    seen: list[StreamEvent] = []
    with pytest.raises(ProviderError) as caught:
        async for event in provider(stub.url).stream(REQUEST):
            seen.append(event)
    assert caught.value.retryable
    assert "throttlingException" in str(caught.value)
    assert seen == [TextDelta("Par")]


async def test_connection_cut_mid_body_is_retryable(stub: BedrockStub) -> None:
    stub.events = load_events("bedrock_text.jsonl")
    stub.cut_after = len(stub.body()) // 2
    with pytest.raises(ProviderError) as caught:
        await collect(provider(stub.url))
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [(429, "ThrottlingException", True), (503, "ServiceUnavailableException", True),
     (500, "InternalServerException", True), (400, "ValidationException", False),
     (403, "AccessDeniedException", False), (404, "ResourceNotFoundException", False)],
)  # fmt: skip
async def test_http_errors_end_to_end(stub: BedrockStub, status: int, code: str, retryable: bool) -> None:
    stub.status = status
    stub.error_body = {"__type": code, "message": "the service says why"}
    stub.error_headers = {"Retry-After": "2"} if status == 429 else {}
    with pytest.raises(ProviderError) as caught:
        await collect(provider(stub.url))
    assert caught.value.retryable is retryable
    assert caught.value.status == status
    assert "the service says why" in str(caught.value)
    assert caught.value.retry_after == (2.0 if status == 429 else None)
    assert len(stub.bodies) == 1, "botocore must not retry on its own"


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ProviderError) as caught:
        await collect(provider(f"http://127.0.0.1:{port}"))
    assert caught.value.retryable


async def test_a_bare_model_id_without_on_demand_access_says_to_use_an_inference_profile(
    stub: BedrockStub,
) -> None:
    stub.status = 400
    stub.error_body = {
        "__type": "ValidationException",
        "message": "Invocation of model ID anthropic.claude-sonnet-4-5-20250929-v1:0 with on-demand throughput "
        "isn't supported. Retry your request with the ID or ARN of an inference profile that contains this model.",
    }
    with pytest.raises(ProviderError) as caught:
        await collect(provider(stub.url))
    assert not caught.value.retryable
    assert "bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0" in str(caught.value)


# ---- one client per provider and event loop ----------------------------------------------------------------


class CountingSession:
    """The test session, counting the clients opened from it."""

    def __init__(self) -> None:
        self.opened = 0

    def client(self, *args: Any, **kwargs: Any) -> Any:
        self.opened += 1
        return SESSION.client(*args, **kwargs)


async def test_calls_on_one_loop_share_one_client_and_its_connection(stub: BedrockStub) -> None:
    stub.events = load_events("bedrock_text.jsonl")
    session = CountingSession()
    p = BedrockProvider(MODEL, info=INFO, region="us-east-1", endpoint_url=stub.url, session=session)
    try:
        first, second = await collect(p), await collect(p)
        assert first == second == TEXT_EVENTS
        assert session.opened == 1
        assert stub.peers[0] == stub.peers[1]  # the second call reused the first one's connection
        await asyncio.gather(*(collect(p) for _ in range(3)))
        assert session.opened == 1
    finally:
        await p.aclose()


async def test_concurrent_first_calls_open_one_client(stub: BedrockStub) -> None:
    stub.events = load_events("bedrock_text.jsonl")
    session = CountingSession()
    p = BedrockProvider(MODEL, info=INFO, region="us-east-1", endpoint_url=stub.url, session=session)
    try:
        results = await asyncio.gather(*(collect(p) for _ in range(3)))
        assert results == [TEXT_EVENTS] * 3 and session.opened == 1
    finally:
        await p.aclose()


def test_each_event_loop_gets_a_client_of_its_own(stub: BedrockStub) -> None:
    stub.events = load_events("bedrock_text.jsonl")
    session = CountingSession()
    p = BedrockProvider(MODEL, info=INFO, region="us-east-1", endpoint_url=stub.url, session=session)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert first.run_until_complete(collect(p)) == TEXT_EVENTS
        assert second.run_until_complete(collect(p)) == TEXT_EVENTS  # not the first loop's client
        assert first.run_until_complete(collect(p)) == TEXT_EVENTS  # the first loop's is still its own
        assert session.opened == 2
        assert stub.peers[0] != stub.peers[1] and stub.peers[0] == stub.peers[2]
        for loop in (first, second):
            loop.run_until_complete(p.aclose())
    finally:
        first.close()
        second.close()
