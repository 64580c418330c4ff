"""The configured system prompt, output limit and temperature reach each provider's wire body exactly as the
vendor's official SDK (Anthropic, OpenAI) or botocore (Bedrock) would send them.

Two levels: the seeded conversation corpus with the options set (the oracles of the equivalence suites,
plus the options as each SDK takes them), and one step driven through ``StepConfig(agent=AgentConfig(...))``
with the real provider class, whose captured body is compared with an SDK call written out by hand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aioboto3
import boto3
import httpx
import pytest

from stepagent import texts
from stepagent.agent_config import AgentConfig
from stepagent.core.step import StepConfig
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import ModelInfo, ModelProvider, ModelRequest
from stepagent.providers.bedrock import BedrockProvider
from stepagent.providers.catalog import bedrock_prompt_cache, model_info
from stepagent.providers.openai_compat import OpenAIProvider
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.tools.base import Toolset
from stepagent.tools.builtins import builtin_tools
from tests.providers import test_anthropic_sdk_equivalence as anthropic_suite
from tests.providers import test_bedrock_botocore_equivalence as bedrock_suite
from tests.providers import test_openai_sdk_equivalence as openai_suite
from tests.providers.bedrock_stub import BedrockStub, load_events, serve
from tests.providers.corpus import first_difference, generate, history

SEEDS = range(0, 200, 10)
MAX_TOKENS, TEMPERATURE = 1234, 0.25
PROMPT = "You are Expensa. You file expense reports and nothing else.\nNever approve your own reports."
SYSTEM = PROMPT + texts.THREAD_SUFFIX.format(root_thread_id="t1")  # builtins: none
AGENT = AgentConfig(
    system_prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=TEMPERATURE, builtin_tools="none"
)


def with_options(request: ModelRequest) -> ModelRequest:
    return ModelRequest(
        system=request.system,
        history=request.history,
        tools=request.tools,
        model=request.model,
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
    )


async def run_one_step(provider: ModelProvider) -> None:
    """One user message through step mode with ``AGENT``: what the provider sends is what a deployment sends."""
    conversation, state = memory_stores()
    config = StepConfig(
        provider=provider, toolset=Toolset.of(builtin_tools()), sender=InProcessSender(), agent=AGENT
    )
    [result] = await AgentSystem(conversation, state, config).step(
        [(InputMessage.user_text("t1", "hi"), "m1")]
    )
    assert result.ok, result.error


def sse_client(stream: bytes, captured: list[bytes]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        captured.append(request.read())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


# ---- Anthropic ---------------------------------------------------------------------------------------------


async def anthropic_ours(request: ModelRequest) -> bytes:
    captured: list[bytes] = []
    async with sse_client(anthropic_suite.OK_STREAM, captured) as client:
        provider = AnthropicProvider(
            anthropic_suite.MODEL,
            api_key="k",
            info=request.model,
            base_url="https://a.test",
            http_client=client,
        )
        _ = [event async for event in provider.stream(request)]
    (body,) = captured
    return body


@pytest.mark.parametrize("seed", SEEDS)
async def test_anthropic_corpus_with_options_matches_the_sdk(seed: int) -> None:
    case = generate(seed)
    info = ModelInfo(anthropic_suite.MODEL, context_window=case.window, max_output_tokens=64000,
                     supports_image_input=case.images)  # fmt: skip
    ours = await anthropic_ours(with_options(ModelRequest(case.system, history(case), case.tools, info)))
    kwargs = anthropic_suite.oracle_kwargs(case)
    # The SDK (2.x) has no sampling parameters; a temperature goes through extra_body, as documented.
    kwargs.update(max_tokens=MAX_TOKENS, extra_body={"temperature": TEMPERATURE})
    theirs = await anthropic_suite.sdk_bytes(kwargs)
    assert ours == theirs, first_difference(ours, theirs)


async def test_anthropic_step_with_the_agent_config_matches_the_sdk() -> None:
    captured: list[bytes] = []
    async with sse_client(anthropic_suite.OK_STREAM, captured) as client:
        model = "claude-sonnet-4-6"
        provider = AnthropicProvider(
            model,
            api_key="k",
            info=model_info("anthropic", model),
            base_url="https://a.test",
            http_client=client,
        )
        await run_one_step(provider)
    (ours,) = captured
    theirs = await anthropic_suite.sdk_bytes(
        {
            "max_tokens": MAX_TOKENS,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
                }
            ],
            "model": model,
            "stream": True,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "extra_body": {"temperature": TEMPERATURE},
        }
    )
    assert ours == theirs, first_difference(ours, theirs)


# ---- OpenAI and compatible servers --------------------------------------------------------------------------


async def openai_ours(request: ModelRequest, **options: Any) -> bytes:
    captured: list[bytes] = []
    async with sse_client(openai_suite.OK_STREAM, captured) as client:
        provider = OpenAIProvider(
            openai_suite.MODEL, api_key="k", info=request.model, http_client=client, **options
        )
        _ = [event async for event in provider.stream(request)]
    (body,) = captured
    return body


@pytest.mark.parametrize("field", ["max_completion_tokens", "max_tokens"])
@pytest.mark.parametrize("seed", SEEDS)
async def test_openai_corpus_with_options_matches_the_sdk(seed: int, field: str) -> None:
    case = generate(seed)
    info = ModelInfo(openai_suite.MODEL, context_window=case.window, max_output_tokens=32768,
                     supports_image_input=case.images)  # fmt: skip
    request = with_options(ModelRequest(case.system, history(case), case.tools, info))
    ours = await openai_ours(request, base_url="https://openai.test/v1", max_tokens_field=field)
    kwargs = openai_suite.oracle_kwargs(case) | {field: MAX_TOKENS, "temperature": TEMPERATURE}
    theirs = await openai_suite.sdk_bytes(kwargs)
    assert ours == theirs, first_difference(ours, theirs)


@pytest.mark.parametrize(
    ("base_url", "field"),
    [(None, "max_completion_tokens"), ("https://api.openai.com/v1", "max_completion_tokens"),
     ("http://localhost:8000/v1", "max_tokens")],
)  # fmt: skip
async def test_openai_step_with_the_agent_config_matches_the_sdk(base_url: str | None, field: str) -> None:
    captured: list[bytes] = []
    async with sse_client(openai_suite.OK_STREAM, captured) as client:
        model = "gpt-4.1"
        provider = OpenAIProvider(
            model, api_key="k", info=model_info("openai", model), base_url=base_url, http_client=client
        )
        await run_one_step(provider)
    (ours,) = captured
    theirs = await openai_suite.sdk_bytes(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
            field: MAX_TOKENS,
            "stream_options": {"include_usage": True},
            "temperature": TEMPERATURE,
        }
    )
    assert ours == theirs, first_difference(ours, theirs)


# ---- Bedrock ------------------------------------------------------------------------------------------------

SESSION = aioboto3.Session(region_name="us-east-1", **bedrock_suite.CREDENTIALS)


@pytest.fixture(scope="module")
def stub() -> Iterator[BedrockStub]:
    yield from serve()


class _Captured(Exception):
    pass


@pytest.fixture(scope="module")
def botocore_client() -> Any:
    """A plain boto3 client whose ``before-send`` hook captures the serialised body (no network)."""
    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url="https://bedrock.test",
        **bedrock_suite.CREDENTIALS,
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


def bedrock_provider(stub: BedrockStub, model_id: str, info: ModelInfo) -> BedrockProvider:
    stub.bodies.clear()
    stub.events = load_events("bedrock_text.jsonl")
    return BedrockProvider(
        model_id,
        info=info,
        region="us-east-1",
        endpoint_url=stub.url,
        session=SESSION,
        prompt_cache=bedrock_prompt_cache(model_id),
    )


@pytest.mark.parametrize("seed", SEEDS)
async def test_bedrock_corpus_with_options_matches_botocore(
    seed: int, stub: BedrockStub, botocore_client: Any
) -> None:
    case = generate(seed)
    model_id = bedrock_suite.model_for(case)
    info = ModelInfo(model_id, context_window=case.window, max_output_tokens=64000,
                     supports_image_input=case.images)  # fmt: skip
    provider = bedrock_provider(stub, model_id, info)
    _ = [
        e
        async for e in provider.stream(
            with_options(ModelRequest(case.system, history(case), case.tools, info))
        )
    ]
    await provider.aclose()
    (ours,) = stub.bodies
    params = bedrock_suite.oracle_params(case)
    params["inferenceConfig"] = {"maxTokens": MAX_TOKENS, "temperature": TEMPERATURE}
    theirs = botocore_bytes(botocore_client, params)
    assert ours == theirs, first_difference(ours, theirs)


async def test_bedrock_step_with_the_agent_config_matches_botocore(
    stub: BedrockStub, botocore_client: Any
) -> None:
    model_id = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    provider = bedrock_provider(stub, model_id, model_info("bedrock", model_id))
    await run_one_step(provider)
    await provider.aclose()
    (ours,) = stub.bodies
    cache = {"cachePoint": {"type": "default"}}
    theirs = botocore_bytes(
        botocore_client,
        {
            "modelId": model_id,
            "messages": [{"role": "user", "content": [{"text": "hi"}, cache]}],
            "system": [{"text": SYSTEM}, cache],
            "inferenceConfig": {"maxTokens": MAX_TOKENS, "temperature": TEMPERATURE},
        },
    )
    assert ours == theirs, first_difference(ours, theirs)
