"""Model catalog lookups and the provider factory (no network)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from stepagent.errors import ConfigurationError
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.bedrock import BedrockProvider
from stepagent.providers.catalog import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_MAX_OUTPUT_TOKENS,
    bedrock_prompt_cache,
    catalog_entry,
    model_info,
)
from stepagent.providers.factory import detect_default_model, make_provider
from stepagent.providers.openai_compat import OpenAIProvider
from stepagent.providers.scripted import ScriptedProvider


@pytest.mark.parametrize(
    ("provider", "model", "window", "max_out", "images"),
    [
        ("anthropic", "claude-sonnet-4-5", 200_000, 64_000, True),
        ("anthropic", "claude-sonnet-4-5-20250929", 200_000, 64_000, True),
        ("anthropic", "claude-opus-4-1-20250805", 200_000, 32_000, True),
        ("anthropic", "claude-haiku-4-5", 200_000, 64_000, True),
        ("anthropic", "claude-sonnet-4-6", 200_000, 64_000, True),
        ("openai", "gpt-4o", 131_072, 16_384, True),
        ("openai", "gpt-4o-2024-11-20", 131_072, 16_384, True),
        ("openai", "gpt-4.1-mini", 1_047_576, 32_768, True),
        ("openai", "gpt-5", 400_000, 128_000, True),
        ("openai", "gpt-5-mini-2025-08-07", 400_000, 128_000, True),
        ("bedrock", "anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000, True),
        ("bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000, True),
        ("bedrock", "global.anthropic.claude-sonnet-4-6", 200_000, 64_000, True),
        ("bedrock", "eu.anthropic.claude-haiku-4-5-20251001-v1:0", 200_000, 64_000, True),
        ("bedrock", "global.anthropic.claude-opus-4-6-v1", 200_000, 128_000, True),
        ("bedrock", "amazon.nova-pro-v1:0", 300_000, 10_000, True),
        ("bedrock", "us.amazon.nova-micro-v1:0", 128_000, 10_000, False),
    ],
)
def test_known_models(provider: str, model: str, window: int, max_out: int, images: bool) -> None:
    info = model_info(provider, model)
    assert (info.model_id, info.context_window, info.max_output_tokens, info.supports_image_input) == (
        model,
        window,
        max_out,
        images,
    )


@pytest.mark.parametrize(("provider", "model"), [("anthropic", "claude-new-9"), ("openai", "llama3.1:8b"),
                                                 ("bedrock", "meta.llama3-70b-instruct-v1:0"), ("other", "x")])  # fmt: skip
def test_unknown_models_are_conservative(provider: str, model: str) -> None:
    info = model_info(provider, model)
    assert info.context_window == DEFAULT_CONTEXT_WINDOW > 0  # never 0: compaction and truncation stay on
    assert info.max_output_tokens == DEFAULT_MAX_OUTPUT_TOKENS
    assert not info.supports_image_input
    assert catalog_entry(provider, model) is None


def test_bedrock_cache_points_only_for_known_models() -> None:
    assert bedrock_prompt_cache("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert bedrock_prompt_cache("amazon.nova-lite-v1:0")
    assert not bedrock_prompt_cache("meta.llama3-70b-instruct-v1:0")


def test_factory_anthropic() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-ant", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/"}
    provider = make_provider("anthropic:claude-sonnet-4-6", environ=env)
    assert isinstance(provider, AnthropicProvider)
    assert provider.info.context_window == 200_000
    assert provider.headers()["x-api-key"] == "sk-ant"


def test_factory_openai_compatible_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    env = {"OPENAI_API_KEY": "sk", "OPENAI_BASE_URL": "http://localhost:11434/v1"}
    with caplog.at_level(logging.WARNING, logger="stepagent.providers.factory"):
        provider = make_provider("openai:llama3.1:8b", environ=env)
    assert isinstance(provider, OpenAIProvider)
    assert provider.info.model_id == "llama3.1:8b"
    assert provider.info.name == "openai:llama3.1:8b"
    # Not in the catalog: the documented default window, and a warning at start naming the setting.
    assert provider.info.context_window == DEFAULT_CONTEXT_WINDOW
    (warning,) = [r for r in caplog.records if "openai:llama3.1:8b" in r.getMessage()]
    assert "STEPAGENT_CONTEXT_WINDOW" in warning.getMessage()


def test_factory_context_window_overrides_the_catalog(caplog: pytest.LogCaptureFixture) -> None:
    env = {"OPENAI_API_KEY": "sk", "OPENAI_BASE_URL": "http://localhost:11434/v1"}
    with caplog.at_level(logging.WARNING, logger="stepagent.providers.factory"):
        unknown = make_provider("openai:qwen-local-7b", environ=env, context_window=8192)
        known = make_provider("openai:gpt-4o", environ=env, context_window=50_000)
    assert unknown.info.context_window == 8192 and known.info.context_window == 50_000
    assert not [r for r in caplog.records if "qwen-local-7b" in r.getMessage()]  # set: no warning


def test_factory_bedrock() -> None:
    env = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://127.0.0.1:9"}
    provider = make_provider("bedrock:eu.anthropic.claude-sonnet-4-5-20250929-v1:0", environ=env)
    assert isinstance(provider, BedrockProvider)
    assert provider.info.context_window == 200_000


def test_factory_scripted(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": [{"text": "hi"}]}))
    assert isinstance(make_provider(f"scripted:{script}", environ={}), ScriptedProvider)


@pytest.mark.parametrize(
    ("model", "variable"),
    [("anthropic:claude-sonnet-4-6", "ANTHROPIC_API_KEY"), ("openai:gpt-4o", "OPENAI_API_KEY")],
)
def test_missing_key_names_the_variable(model: str, variable: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_provider(model, environ={variable: "  "})
    assert variable in str(caught.value)


@pytest.mark.parametrize("model", ["claude", "mystery:model", "anthropic:", ""])
def test_invalid_model_strings(model: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_provider(model, environ={"ANTHROPIC_API_KEY": "k"})
    assert "STEPAGENT_MODEL" in str(caught.value)


def test_detect_default_model() -> None:
    assert (
        detect_default_model({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"})
        == "anthropic:claude-sonnet-4-6"
    )
    assert detect_default_model({"OPENAI_API_KEY": "k"}) == "openai:gpt-4.1"
    assert detect_default_model({"ANTHROPIC_API_KEY": ""}) is None
    assert detect_default_model({}) is None
    for model in ("anthropic:claude-sonnet-4-6", "openai:gpt-4.1"):
        provider, model_id = model.split(":", 1)
        assert model_info(provider, model_id).context_window > 0  # the defaults are in the catalog
