"""Our Chat Completions request bodies are byte-identical to the official ``openai`` SDK's for 200 seeded
conversations. The SDK call is built here from the logical conversation, following the Chat Completions
documentation, never from our translation code; both requests are captured by mock transports."""

from __future__ import annotations

import enum
import json
from typing import Any

import httpx
import httpx2
import openai
import pydantic
import pytest
from openai.lib._parsing._completions import type_to_response_format_param

from stepagent.history_items import INJECTED_TOOL_NAME, SUMMARY_PREFIX
from stepagent.messages import ImageBlock
from stepagent.output_schema import OutputSchema
from stepagent.providers.base import ModelInfo, ModelRequest
from stepagent.providers.openai_compat import TOOL_IMAGES_FOLLOW, TOOL_IMAGES_LABEL, OpenAIProvider
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
    first_difference,
    generate,
    history,
)

SEEDS = range(200)
MODEL = "gpt-4.1"
OK_STREAM = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,'
    b'"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


# ---- the oracle ------------------------------------------------------------------------------------------

Item = tuple[str, Any]  # ("text", str) | ("image", url) | ("result", (id, texts, images)) | ("call", dict)


def _url(data: str, media_type: str | None) -> str:
    return f"data:{image_media_type(ImageBlock(data=data, media_type=media_type))};base64,{data}"


def _result(case: Case, call_id: str, blocks: list[tuple[str, str, str | None]]) -> Item:
    texts: list[str] = []
    images: list[str] = []
    for kind, value, media_type in blocks:
        if kind == "image":
            if case.images:
                images.append(_url(value, media_type))
            else:
                texts.append(IMAGE_OMITTED)
        elif value.strip():
            texts.append(value)
    if not texts and not images:
        texts = [EMPTY_OUTPUT]
    return ("result", (wire_tool_id(call_id), texts, images))


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> Item:
    args = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return (
        "call",
        {"id": wire_tool_id(call_id), "type": "function", "function": {"name": name, "arguments": args}},
    )


def oracle_kwargs(case: Case) -> dict[str, Any]:
    seq: list[tuple[str, Item]] = []
    trailing: str | None = None
    for turn in case.turns:
        match turn:
            case LSummary(text=text):
                seq.append(("assistant", ("text", SUMMARY_PREFIX + text)))
            case LText(text=text):
                seq.append(("user", ("text", text if text.strip() else EMPTY_USER_TEXT)))
            case LImage(data=data, media_type=media_type):
                seq.append(
                    ("user", ("image", _url(data, media_type)) if case.images else ("text", IMAGE_OMITTED))
                )
            case LAssistant(text=text, call=call):
                if text is not None and text.strip():
                    seq.append(("assistant", ("text", text)))
                if call is not None:
                    seq.append(("assistant", _call(*call)))
                    trailing = wire_tool_id(call[0])
            case LResult(call_id=call_id, blocks=blocks):
                seq.append(("user", _result(case, call_id, blocks)))
                trailing = None
            case LEvent(invocation_id=inv, original_id=original, original_name=name, blocks=blocks):
                args = {"original_args": {}, "original_tool_call_id": original, "original_tool_name": name}
                seq.append(("assistant", _call(inv, INJECTED_TOOL_NAME, args)))
                seq.append(("user", _result(case, inv, blocks)))
    if trailing is not None:
        seq.append(("user", ("result", (trailing, [PENDING_RESULT], []))))
    if not seq or seq[0][0] != "user":
        seq.insert(0, ("user", ("text", CONVERSATION_START)))
    groups: list[tuple[str, list[Item]]] = []
    for role, item in seq:
        if groups and groups[-1][0] == role:
            groups[-1][1].append(item)
        else:
            groups.append((role, [item]))
    messages: list[dict[str, Any]] = []
    if case.system.strip():
        messages.append({"role": "system", "content": case.system})
    for role, items in groups:
        if role == "assistant":
            texts = [value for kind, value in items if kind == "text"]
            calls = [value for kind, value in items if kind == "call"]
            if not texts and not calls:
                continue
            message: dict[str, Any] = {"role": "assistant"}
            if texts:
                message["content"] = "\n\n".join(texts)
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            continue
        rest: list[dict[str, Any]] = []
        for kind, value in items:
            if kind == "result":
                call_id, texts, images = value
                tool_text = list(texts)
                if images:
                    tool_text.append(TOOL_IMAGES_FOLLOW.format(count=len(images)))
                    rest.append({"type": "text", "text": TOOL_IMAGES_LABEL.format(id=call_id)})
                    rest.extend({"type": "image_url", "image_url": {"url": url}} for url in images)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": "\n".join(tool_text)})
            elif kind == "text":
                rest.append({"type": "text", "text": value})
            else:
                rest.append({"type": "image_url", "image_url": {"url": value}})
        if len(rest) == 1 and rest[0]["type"] == "text":
            messages.append({"role": "user", "content": rest[0]["text"]})
        elif rest:
            messages.append({"role": "user", "content": rest})
    kwargs: dict[str, Any] = {"messages": messages, "model": MODEL, "stream": True,
                              "stream_options": {"include_usage": True}}  # fmt: skip
    if case.tools:
        kwargs["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in case.tools
        ]
        kwargs["parallel_tool_calls"] = False
    return kwargs


# ---- capture ---------------------------------------------------------------------------------------------


def capturing_sdk() -> tuple[openai.AsyncOpenAI, list[bytes]]:
    """The SDK's client over a transport that records each request body and answers with a canned stream."""
    captured: list[bytes] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        captured.append(request.read())
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=OK_STREAM)

    client = openai.AsyncOpenAI(
        api_key="test-key",
        base_url="https://openai.test/v1",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    return client, captured


async def sdk_bytes(kwargs: dict[str, Any]) -> bytes:
    client, captured = capturing_sdk()
    stream = await client.chat.completions.create(**kwargs)
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
        info = ModelInfo(MODEL, context_window=case.window, max_output_tokens=32768,
                         supports_image_input=case.images)  # fmt: skip
        provider = OpenAIProvider(
            MODEL, api_key="test-key", info=info, base_url="https://openai.test/v1/", http_client=client
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


@pytest.mark.parametrize("seed", SEEDS)
async def test_body_matches_sdk(seed: int) -> None:
    case = generate(seed)
    ours, request = await our_bytes(case)
    theirs = await sdk_bytes(oracle_kwargs(case))
    assert ours == theirs, first_difference(ours, theirs)
    assert request.url == "https://openai.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer test-key"


async def test_retry_resends_identical_bytes() -> None:
    case = generate(11)
    first, _ = await our_bytes(case)
    second, _ = await our_bytes(case)
    assert first == second


# ---- structured output: response_format with json_schema ------------------------------------------------------

SCHEMA = {
    "title": "Weather report",
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", range(0, 200, 20))
async def test_an_output_schema_is_sent_as_the_sdks_response_format(seed: int) -> None:
    case = generate(seed)
    ours, _ = await our_bytes(case, SCHEMA)
    # The name must match ^[a-zA-Z0-9_-]{1,64}$: the schema's title with other characters replaced.
    response_format = {"type": "json_schema", "json_schema": {"name": "Weather_report", "schema": SCHEMA}}
    theirs = await sdk_bytes(oracle_kwargs(case) | {"response_format": response_format})
    assert ours == theirs, first_difference(ours, theirs)


# A pydantic class is sent as ``parse()``/``stream()`` send it: the strict schema (every object closed, every
# property required, ``$ref`` with siblings inlined, ``None`` defaults dropped), named after the class,
# ``strict: true``. Nested model, optional field, list, enum.


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Reading(pydantic.BaseModel):
    value: float = pydantic.Field(description="the measured value")
    unit: Unit = Unit.CELSIUS


class Forecast(pydantic.BaseModel):
    """A forecast for one city."""

    city: str
    current: Reading = pydantic.Field(description="now")
    hourly: list[Reading]
    note: str | None = None
    tags: list[str] = []


@pytest.mark.parametrize("seed", [0, 40, 120])
async def test_a_pydantic_class_is_sent_as_the_sdk_sends_it(seed: int) -> None:
    case = generate(seed)
    schema = OutputSchema.of(Forecast)
    ours, _ = await our_bytes(case, schema.schema, schema.class_name)
    theirs = await sdk_bytes(
        oracle_kwargs(case) | {"response_format": type_to_response_format_param(Forecast)}
    )
    assert ours == theirs, first_difference(ours, theirs)
    sent = json.loads(ours)["response_format"]["json_schema"]
    assert sent["name"] == "Forecast" and sent["strict"] is True
    assert sent["schema"]["required"] == ["city", "current", "hourly", "note", "tags"]
    assert "additionalProperties" not in schema.schema  # the original is not touched


async def test_the_sdks_stream_helper_sends_the_same_bytes() -> None:
    # ``stream()`` refuses non-strict tools, so a conversation without tools.
    case = next(c for c in map(generate, SEEDS) if not c.tools)
    schema = OutputSchema.of(Forecast)
    ours, _ = await our_bytes(case, schema.schema, schema.class_name)
    client, captured = capturing_sdk()
    kwargs = {k: v for k, v in oracle_kwargs(case).items() if k != "stream"}
    async with client.chat.completions.stream(**kwargs, response_format=Forecast):
        pass  # the request is sent on entry; the canned answer is not a Forecast, so it is not read
    await client.close()
    assert ours == captured[0], first_difference(ours, captured[0])


async def test_a_dict_schema_is_sent_as_given() -> None:
    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    ours, _ = await our_bytes(generate(5), open_schema)
    assert json.loads(ours)["response_format"]["json_schema"] == {"name": "output", "schema": open_schema}
