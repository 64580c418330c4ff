"""Our Anthropic request bodies are byte-identical to the official ``anthropic`` SDK's for 200 seeded
conversations. The SDK call is built here from the logical conversation, following the Messages API
documentation, never from our translation code; both requests are captured by mock transports."""

from __future__ import annotations

import enum
import json
from typing import Any

import anthropic
import httpx
import httpx2
import pydantic
import pytest
from anthropic.lib._parse._transform import to_json_output_format

from stepagent.errors import ProviderError
from stepagent.history_items import INJECTED_TOOL_NAME, SUMMARY_PREFIX
from stepagent.messages import ImageBlock
from stepagent.output_schema import OutputSchema
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import ModelInfo, ModelRequest
from stepagent.providers.requests_common import (
    CONVERSATION_START,
    EMPTY_OUTPUT,
    EMPTY_USER_TEXT,
    PENDING_RESULT,
    image_media_type,
    wire_tool_id,
)
from stepagent.texts import IMAGE_OMITTED
from tests.providers.corpus import (
    Case,
    LAssistant,
    LEvent,
    LImage,
    LResult,
    LSummary,
    LText,
    coverage,
    first_difference,
    generate,
    history,
)

SEEDS = range(200)
MODEL = "claude-sonnet-4-6"
MAX_TOKENS = 64000
OK_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
EPHEMERAL = {"type": "ephemeral"}


# ---- the oracle: SDK arguments straight from the logical conversation ------------------------------------


def _image(case: Case, data: str, media_type: str | None) -> dict[str, Any]:
    if not case.images:
        return {"type": "text", "text": IMAGE_OMITTED}
    mt = image_media_type(ImageBlock(data=data, media_type=media_type))
    return {"type": "image", "source": {"type": "base64", "media_type": mt, "data": data}}


def _result_content(case: Case, blocks: list[tuple[str, str, str | None]]) -> list[dict[str, Any]]:
    out = []
    for kind, value, media_type in blocks:
        if kind == "image":
            out.append(_image(case, value, media_type))
        elif value.strip():
            out.append({"type": "text", "text": value})
    return out or [{"type": "text", "text": EMPTY_OUTPUT}]


def oracle_kwargs(case: Case) -> dict[str, Any]:
    blocks: list[tuple[str, dict[str, Any]]] = []
    trailing: str | None = None
    for turn in case.turns:
        match turn:
            case LSummary(text=text):
                blocks.append(("assistant", {"type": "text", "text": SUMMARY_PREFIX + text}))
            case LText(text=text):
                blocks.append(("user", {"type": "text", "text": text if text.strip() else EMPTY_USER_TEXT}))
            case LImage(data=data, media_type=media_type):
                blocks.append(("user", _image(case, data, media_type)))
            case LAssistant(reasoning=reasoning, text=text, call=call):
                for r_text, signature, redacted in reasoning:
                    if redacted is not None:
                        blocks.append(("assistant", {"type": "redacted_thinking", "data": redacted}))
                    else:
                        block = {"type": "thinking", "thinking": r_text, "signature": signature}
                        blocks.append(("assistant", block))
                if text is not None and text.strip():
                    blocks.append(("assistant", {"type": "text", "text": text}))
                if call is not None:
                    tool_use = {
                        "type": "tool_use",
                        "id": wire_tool_id(call[0]),
                        "name": call[1],
                        "input": call[2],
                    }
                    blocks.append(("assistant", tool_use))
                    trailing = wire_tool_id(call[0])
            case LResult(call_id=call_id, blocks=result_blocks):
                content = _result_content(case, result_blocks)
                blocks.append(
                    (
                        "user",
                        {"type": "tool_result", "tool_use_id": wire_tool_id(call_id), "content": content},
                    )
                )
                trailing = None
            case LEvent(invocation_id=inv, original_id=original, original_name=name, blocks=result_blocks):
                args = {"original_args": {}, "original_tool_call_id": original, "original_tool_name": name}
                wid = wire_tool_id(inv)
                blocks.append(
                    ("assistant", {"type": "tool_use", "id": wid, "name": INJECTED_TOOL_NAME, "input": args})
                )
                content = _result_content(case, result_blocks)
                blocks.append(("user", {"type": "tool_result", "tool_use_id": wid, "content": content}))
    if trailing is not None:
        content = [{"type": "text", "text": PENDING_RESULT}]
        blocks.append(("user", {"type": "tool_result", "tool_use_id": trailing, "content": content}))
    if blocks[0][0] != "user":
        blocks.insert(0, ("user", {"type": "text", "text": CONVERSATION_START}))
    messages: list[dict[str, Any]] = []
    for role, block in blocks:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})
    for message in messages:
        if message["role"] == "assistant":
            thinking = [b for b in message["content"] if b["type"] in ("thinking", "redacted_thinking")]
            message["content"] = thinking + [b for b in message["content"] if b not in thinking]
    for block in reversed(messages[-1]["content"]):
        if block["type"] not in ("thinking", "redacted_thinking"):
            block["cache_control"] = EPHEMERAL
            break
    kwargs: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": messages, "model": MODEL, "stream": True}
    if case.system.strip():
        kwargs["system"] = [{"type": "text", "text": case.system, "cache_control": EPHEMERAL}]
    if case.tools:
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in case.tools
        ]
        tools[-1]["cache_control"] = EPHEMERAL
        kwargs["tools"] = tools
        kwargs["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
    return kwargs


# ---- capture ---------------------------------------------------------------------------------------------


def capturing_sdk() -> tuple[anthropic.AsyncAnthropic, list[bytes]]:
    """The SDK's client over a transport that records each request body and answers with a canned stream."""
    captured: list[bytes] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        captured.append(request.read())
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=OK_STREAM)

    client = anthropic.AsyncAnthropic(
        api_key="test-key",
        base_url="https://anthropic.test",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    return client, captured


async def sdk_bytes(kwargs: dict[str, Any]) -> bytes:
    client, captured = capturing_sdk()
    stream = await client.messages.create(**kwargs)
    async for _ in stream:
        pass
    await client.close()
    assert len(captured) == 1
    return captured[0]


async def our_bytes(
    case: Case, output_schema: dict[str, Any] | None = None, schema_class: str | None = None
) -> tuple[bytes, httpx.Request]:
    captured: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=OK_STREAM)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        info = ModelInfo(MODEL, context_window=case.window, max_output_tokens=MAX_TOKENS,
                         supports_image_input=case.images)  # fmt: skip
        provider = AnthropicProvider(
            MODEL, api_key="test-key", info=info, base_url="https://anthropic.test", http_client=client
        )
        request = ModelRequest(
            system=case.system,
            history=history(case),
            tools=case.tools,
            model=info,
            output_schema=output_schema,
            output_schema_class=schema_class,
        )
        events = [event async for event in provider.stream(request)]
    assert events, "the stream produced no events"
    assert len(captured) == 1
    return captured[0].content, captured[0]


# ---- tests -----------------------------------------------------------------------------------------------


def test_corpus_covers_every_feature() -> None:
    counts = coverage([generate(seed) for seed in SEEDS])
    assert all(count > 0 for count in counts.values()), counts


@pytest.mark.parametrize("seed", SEEDS)
async def test_body_matches_sdk(seed: int) -> None:
    case = generate(seed)
    ours, request = await our_bytes(case)
    theirs = await sdk_bytes(oracle_kwargs(case))
    assert ours == theirs, first_difference(ours, theirs)
    assert request.url == "https://anthropic.test/v1/messages"
    assert request.headers["x-api-key"] == "test-key"
    assert request.headers["anthropic-version"] == "2023-06-01"


async def test_retry_resends_identical_bytes() -> None:
    case = generate(7)
    first, _ = await our_bytes(case)
    second, _ = await our_bytes(case)
    assert first == second


# ---- structured output: the Messages API's output_config.format ---------------------------------------------

SCHEMA = {
    "title": "Weather report",
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}, "tags": {"type": "array"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(0, 200, 20))
async def test_an_output_schema_is_sent_as_the_sdk_sends_output_config(seed: int) -> None:
    case = generate(seed)
    ours, _ = await our_bytes(case, SCHEMA)
    kwargs = oracle_kwargs(case) | {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    theirs = await sdk_bytes(kwargs)
    assert ours == theirs, first_difference(ours, theirs)


# A pydantic class is sent as the SDK sends it: ``transform_schema`` closes every object and moves the keywords
# the API does not support into descriptions. Nested model, optional field, list, enum, defaults, a format.


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Reading(pydantic.BaseModel):
    value: float = pydantic.Field(ge=-100, description="the measured value")
    unit: Unit = Unit.CELSIUS


class Forecast(pydantic.BaseModel):
    """A forecast for one city."""

    city: str = pydantic.Field(max_length=80)
    current: Reading
    hourly: list[Reading] = pydantic.Field(min_length=1)
    note: str | None = None
    tags: list[str] = []
    issued: str = pydantic.Field(json_schema_extra={"format": "date-time"})


class Closed(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    answer: int


class Untyped(pydantic.BaseModel):
    anything: Any


@pytest.mark.parametrize(("model", "seed"), [(Forecast, 0), (Forecast, 40), (Forecast, 120), (Closed, 60)])
async def test_a_pydantic_class_is_sent_as_the_sdk_sends_it(
    model: type[pydantic.BaseModel], seed: int
) -> None:
    case = generate(seed)
    schema = OutputSchema.of(model)
    ours, _ = await our_bytes(case, schema.schema, schema.class_name)
    # ``transform_schema`` is the SDK's public rewrite; ``parse()``/``stream()`` apply it to the same schema.
    expected = {"type": "json_schema", "schema": anthropic.transform_schema(model)}
    assert to_json_output_format(model) == expected
    theirs = await sdk_bytes(oracle_kwargs(case) | {"output_config": {"format": expected}})
    assert ours == theirs, first_difference(ours, theirs)
    sent = json.loads(ours)["output_config"]["format"]["schema"]
    assert sent["additionalProperties"] is False
    assert "additionalProperties" not in schema.schema or model is Closed  # the original is not touched


async def test_the_sdks_stream_helper_sends_the_same_output_config() -> None:
    case = generate(3)
    schema = OutputSchema.of(Forecast)
    ours, _ = await our_bytes(case, schema.schema, schema.class_name)
    client, captured = capturing_sdk()
    kwargs = {k: v for k, v in oracle_kwargs(case).items() if k != "stream"}
    async with client.messages.stream(**kwargs, output_format=Forecast) as stream:
        async for _ in stream:
            pass
    await client.close()
    # The helper orders the body's keys its own way; the request is the same JSON.
    assert json.loads(ours) == json.loads(captured[0])


async def test_a_dict_schema_is_sent_as_given() -> None:
    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    ours, _ = await our_bytes(generate(5), open_schema)
    assert json.loads(ours)["output_config"]["format"]["schema"] == open_schema


async def test_a_class_the_sdk_cannot_transform_fails_the_request_clearly() -> None:
    schema = OutputSchema.of(Untyped)
    with pytest.raises(ProviderError, match="Untyped cannot be used for Anthropic structured output") as info:
        await our_bytes(generate(5), schema.schema, schema.class_name)
    assert not info.value.retryable
    with pytest.raises(ValueError, match="Schema must have a 'type'"):
        anthropic.transform_schema(Untyped)
