"""The prompt-cache TTL on the wire: Anthropic's ``cache_control`` and Bedrock's ``cachePoint``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from stepagent.history_items import ToolCallItem, ToolResultItem, UserItem
from stepagent.messages import TextContent, ToolCall, ToolResult
from stepagent.providers import bedrock
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import ModelInfo, ModelRequest, ToolSpec
from stepagent.providers.bedrock import BedrockProvider, converse_params
from stepagent.providers.catalog import bedrock_cache_ttl

INFO = ModelInfo("claude-sonnet-4-5", context_window=200_000, max_output_tokens=4_096)
REQUEST = ModelRequest(
    system="be brief",
    history=[
        UserItem(TextContent(text="look it up")),
        ToolCallItem(ToolCall(id="c1", name="lookup", arguments={"q": "x"})),
        ToolResultItem(ToolResult.text("c1", "found")),
    ],
    tools=[ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}})],
    model=INFO,
)


def controls(value: Any) -> list[Any]:
    """Every ``cache_control`` / ``cachePoint`` in a body, in order."""
    found: list[Any] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("cache_control", "cachePoint"):
                found.append(inner)
            else:
                found += controls(inner)
    elif isinstance(value, list):
        for inner in value:
            found += controls(inner)
    return found


def anthropic_body(request: ModelRequest) -> dict[str, Any]:
    provider = AnthropicProvider("claude-sonnet-4-5", api_key="k", info=INFO)
    return dict(json.loads(provider.request_bytes(request)))


def test_anthropic_marks_every_breakpoint_with_the_requests_ttl() -> None:
    five = anthropic_body(REQUEST)
    assert controls(five) == [{"type": "ephemeral"}] * 3  # tools, system, last message: the default
    hour = anthropic_body(dataclasses.replace(REQUEST, cache_ttl="1h"))
    assert controls(hour) == [{"type": "ephemeral", "ttl": "1h"}] * 3  # one TTL: never 1h after 5m
    # Only the markers differ: the prefix the cache matches on is the same bytes.
    strip = json.dumps(five).replace(', "cache_control": {"type": "ephemeral"}', "")
    assert strip == json.dumps(hour).replace(', "cache_control": {"type": "ephemeral", "ttl": "1h"}', "")


def test_bedrock_sends_the_ttl_only_to_models_that_take_one() -> None:
    hour = dataclasses.replace(REQUEST, cache_ttl="1h")
    taken = converse_params(hour, "m", cache_ttl=True)
    assert controls(taken) == [{"type": "default", "ttl": "1h"}] * 3
    assert controls(converse_params(hour, "m", cache_ttl=False)) == [{"type": "default"}] * 3
    assert controls(converse_params(REQUEST, "m", cache_ttl=True)) == [{"type": "default"}] * 3
    assert bedrock_cache_ttl("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert bedrock_cache_ttl("global.anthropic.claude-opus-4-6-v1")
    assert not bedrock_cache_ttl("anthropic.claude-sonnet-4-20250514-v1:0")
    assert not bedrock_cache_ttl("amazon.nova-pro-v1:0")
    assert not bedrock_cache_ttl("meta.llama3-70b-instruct-v1:0")


@pytest.mark.parametrize("sdk_knows", [True, False])
def test_bedrock_leaves_the_ttl_out_when_the_installed_botocore_would_reject_it(
    sdk_knows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bedrock, "sdk_takes_cache_ttl", lambda: sdk_knows)
    provider = BedrockProvider("m", info=INFO, region="us-east-1", session=object(), cache_ttl=True)
    params = provider.request_params(dataclasses.replace(REQUEST, cache_ttl="1h"))
    expected = {"type": "default", "ttl": "1h"} if sdk_knows else {"type": "default"}
    assert controls(params) == [expected] * 3
