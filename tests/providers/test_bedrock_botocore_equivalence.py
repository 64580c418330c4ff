"""Our ConverseStream request bodies are byte-identical to what botocore serialises for 200 seeded
conversations. The expected parameters are built here from the logical conversation, following the
Converse API documentation, and serialised by a plain boto3 client whose ``before-send`` hook captures the
body (no network). Ours go through the provider's real aioboto3 path to a loopback stub endpoint."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import aioboto3
import boto3
import pytest
from botocore.validate import validate_parameters

from stepagent.history_items import INJECTED_TOOL_NAME, SUMMARY_PREFIX
from stepagent.messages import ImageBlock
from stepagent.output_schema import schema_instruction
from stepagent.providers.base import ModelInfo, ModelRequest
from stepagent.providers.bedrock import BedrockProvider, converse_params
from stepagent.providers.catalog import bedrock_prompt_cache
from stepagent.providers.requests_common import (
    CONVERSATION_START,
    EMPTY_OUTPUT,
    EMPTY_USER_TEXT,
    PENDING_RESULT,
    image_media_type,
    wire_tool_id,
)
from stepagent.texts import IMAGE_OMITTED
from tests.providers.bedrock_stub import BedrockStub, load_events, serve
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
CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
OTHER = "meta.llama3-70b-instruct-v1:0"
MAX_TOKENS = 64000
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
# One session for the module, as in production (one per provider): it caches botocore's service models.
SESSION = aioboto3.Session(region_name="us-east-1", **CREDENTIALS)


def model_for(case: Case) -> str:
    return OTHER if case.seed % 4 == 0 else CLAUDE


# ---- the oracle ------------------------------------------------------------------------------------------


def _image(case: Case, data: str, media_type: str | None) -> dict[str, Any]:
    if not case.images:
        return {"text": IMAGE_OMITTED}
    fmt = image_media_type(ImageBlock(data=data, media_type=media_type)).split("/")[1]
    return {"image": {"format": fmt, "source": {"bytes": base64.b64decode(data)}}}


def _result(case: Case, call_id: str, blocks: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    content = []
    for kind, value, media_type in blocks:
        if kind == "image":
            content.append(_image(case, value, media_type))
        elif value.strip():
            content.append({"text": value})
    return {
        "toolResult": {"toolUseId": wire_tool_id(call_id), "content": content or [{"text": EMPTY_OUTPUT}]}
    }


def oracle_params(case: Case) -> dict[str, Any]:
    cache = model_for(case) == CLAUDE
    blocks: list[tuple[str, dict[str, Any]]] = []
    trailing: str | None = None
    for turn in case.turns:
        match turn:
            case LSummary(text=text):
                blocks.append(("assistant", {"text": SUMMARY_PREFIX + text}))
            case LText(text=text):
                blocks.append(("user", {"text": text if text.strip() else EMPTY_USER_TEXT}))
            case LImage(data=data, media_type=media_type):
                blocks.append(("user", _image(case, data, media_type)))
            case LAssistant(reasoning=reasoning, text=text, call=call):
                for r_text, signature, redacted in reasoning:
                    if redacted is not None:
                        reasoning_block = {"redactedContent": base64.b64decode(redacted)}
                    else:
                        reasoning_block = {"reasoningText": {"text": r_text, "signature": signature}}
                    blocks.append(("assistant", {"reasoningContent": reasoning_block}))
                if text is not None and text.strip():
                    blocks.append(("assistant", {"text": text}))
                if call is not None:
                    tool_use = {"toolUseId": wire_tool_id(call[0]), "name": call[1], "input": call[2]}
                    blocks.append(("assistant", {"toolUse": tool_use}))
                    trailing = wire_tool_id(call[0])
            case LResult(call_id=call_id, blocks=result_blocks):
                blocks.append(("user", _result(case, call_id, result_blocks)))
                trailing = None
            case LEvent(invocation_id=inv, original_id=original, original_name=name, blocks=result_blocks):
                args = {"original_args": {}, "original_tool_call_id": original, "original_tool_name": name}
                tool_use = {"toolUseId": wire_tool_id(inv), "name": INJECTED_TOOL_NAME, "input": args}
                blocks.append(("assistant", {"toolUse": tool_use}))
                blocks.append(("user", _result(case, inv, result_blocks)))
    if trailing is not None:
        blocks.append(
            ("user", {"toolResult": {"toolUseId": trailing, "content": [{"text": PENDING_RESULT}]}})
        )
    if blocks[0][0] != "user":
        blocks.insert(0, ("user", {"text": CONVERSATION_START}))
    messages: list[dict[str, Any]] = []
    for role, block in blocks:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})
    for message in messages:
        if message["role"] == "assistant":
            first = [b for b in message["content"] if "reasoningContent" in b]
            message["content"] = first + [b for b in message["content"] if "reasoningContent" not in b]
    if cache:
        messages[-1]["content"].append({"cachePoint": {"type": "default"}})
    params: dict[str, Any] = {"modelId": model_for(case), "messages": messages}
    if case.system.strip():
        params["system"] = [{"text": case.system}] + ([{"cachePoint": {"type": "default"}}] if cache else [])
    params["inferenceConfig"] = {"maxTokens": MAX_TOKENS}
    if case.tools:
        tools: list[dict[str, Any]] = [
            {
                "toolSpec": {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": {"json": t.parameters},
                }
            }
            for t in case.tools
        ]
        if cache:
            tools.append({"cachePoint": {"type": "default"}})
        params["toolConfig"] = {"tools": tools}
    return params


class _Captured(Exception):
    pass


@pytest.fixture(scope="module")
def botocore_client() -> Any:
    client = boto3.client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url="https://bedrock.test", **CREDENTIALS
    )
    captured: list[bytes] = []

    def hook(request: Any, **_: Any) -> None:
        captured.append(request.body)
        raise _Captured

    client.meta.events.register("before-send.bedrock-runtime.ConverseStream", hook)
    client.captured = captured
    return client


def botocore_bytes(client: Any, params: dict[str, Any]) -> bytes:
    client.captured.clear()
    with pytest.raises(_Captured):
        client.converse_stream(**params)
    (body,) = client.captured
    return bytes(body)


@pytest.fixture(scope="module")
def stub() -> Iterator[BedrockStub]:
    yield from serve()


async def our_bytes(stub: BedrockStub, case: Case) -> bytes:
    stub.bodies.clear()
    stub.events = load_events("bedrock_text.jsonl")
    model_id = model_for(case)
    info = ModelInfo(model_id, context_window=case.window, max_output_tokens=MAX_TOKENS,
                     supports_image_input=case.images)  # fmt: skip
    provider = BedrockProvider(
        model_id,
        info=info,
        region="us-east-1",
        endpoint_url=stub.url,
        session=SESSION,
        prompt_cache=bedrock_prompt_cache(model_id),
    )
    request = ModelRequest(system=case.system, history=history(case), tools=case.tools, model=info)
    events = [event async for event in provider.stream(request)]
    await provider.aclose()
    assert events, "the stream produced no events"
    (body,) = stub.bodies
    return body


@pytest.mark.parametrize("seed", SEEDS)
async def test_body_matches_botocore(seed: int, stub: BedrockStub, botocore_client: Any) -> None:
    case = generate(seed)
    ours = await our_bytes(stub, case)
    theirs = botocore_bytes(botocore_client, oracle_params(case))
    assert ours == theirs, first_difference(ours, theirs)
    assert stub.paths[-1].startswith("/model/") and stub.paths[-1].endswith("/converse-stream")


async def test_retry_resends_identical_bytes(stub: BedrockStub) -> None:
    case = generate(5)
    assert await our_bytes(stub, case) == await our_bytes(stub, case)


def test_an_output_schema_becomes_an_instruction_after_the_system_prompt() -> None:
    """The pinned botocore has no Converse ``outputConfig``: the schema is stated in the system prompt
    (the runtime validates the answer either way), and the request stays one botocore accepts."""
    schema = {"type": "object", "required": ["city"]}
    info = ModelInfo("anthropic.claude-haiku-4-5", context_window=200_000)
    request = ModelRequest(system="Be brief.", history=[], tools=[], model=info, output_schema=schema)
    params = converse_params(request, "anthropic.claude-haiku-4-5")
    assert params["system"][0] == {"text": "Be brief.\n\n" + schema_instruction(schema)}
    assert '{"required": ["city"], "type": "object"}' in params["system"][0]["text"]
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    validate_parameters(params, client.meta.service_model.operation_model("ConverseStream").input_shape)
