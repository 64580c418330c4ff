"""A small catalog of known models: context window, maximum output tokens, image input, prompt caching.

Guarantees:

- :func:`model_info` never fails: an unknown model gets :data:`DEFAULT_CONTEXT_WINDOW` (a conservative
  32,768 tokens — most self-hosted and older models have at least that — so compaction and request
  truncation stay on; ``STEPAGENT_CONTEXT_WINDOW`` sets the real figure, and the factory warns at start
  when it is missing), :data:`DEFAULT_MAX_OUTPUT_TOKENS` and no image input (the conservative choice: an
  image placeholder is better than a rejected request). It is never 0 for a real provider.
- Dated snapshots resolve to their family (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``,
  ``gpt-4o-2024-11-20`` → ``gpt-4o``), and Bedrock ids resolve through their inference-profile prefix
  (``us.``, ``eu.``, ``apac.``, ``global.``, ...), their ``anthropic.`` vendor prefix and their
  ``-v1:0`` version suffix, so ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` is Claude Sonnet 4.5.
- Numbers are the vendors' published limits at the time of writing; a wrong entry only shifts when
  compaction and truncation start, it never breaks a request (the API still enforces the real limit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from stepagent.providers.base import ModelInfo

DEFAULT_MAX_OUTPUT_TOKENS = 4096
#: The context window assumed for a model the catalog does not know (set ``STEPAGENT_CONTEXT_WINDOW``).
DEFAULT_CONTEXT_WINDOW = 32_768


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """What the catalog knows of a model: context window, output limit, image input."""

    context_window: int
    max_output_tokens: int
    images: bool = True
    prompt_cache: bool = True  # Bedrock: whether ``cachePoint`` blocks are accepted
    cache_ttl: bool = False  # Bedrock: whether a cache point takes ``ttl`` (the one-hour entry)


_K = 1000
_CLAUDE: dict[str, CatalogEntry] = {
    "claude-opus-4-8": CatalogEntry(1_000_000, 128_000, cache_ttl=True),
    "claude-opus-4-6": CatalogEntry(200_000, 128_000, cache_ttl=True),
    "claude-opus-4-5": CatalogEntry(200_000, 64_000, cache_ttl=True),
    "claude-opus-4-1": CatalogEntry(200_000, 32_000),
    "claude-opus-4": CatalogEntry(200_000, 32_000),
    "claude-sonnet-4-6": CatalogEntry(200_000, 64_000, cache_ttl=True),
    "claude-sonnet-4-5": CatalogEntry(200_000, 64_000, cache_ttl=True),
    "claude-sonnet-4": CatalogEntry(200_000, 64_000),
    "claude-haiku-4-5": CatalogEntry(200_000, 64_000, cache_ttl=True),
    "claude-3-7-sonnet": CatalogEntry(200_000, 64_000),
    "claude-3-5-haiku": CatalogEntry(200_000, 8192, images=False),
}

_OPENAI: dict[str, CatalogEntry] = {
    "gpt-4o": CatalogEntry(128 * 1024, 16_384),
    "gpt-4o-mini": CatalogEntry(128 * 1024, 16_384),
    "chatgpt-4o-latest": CatalogEntry(128 * 1024, 16_384),
    "gpt-4.1": CatalogEntry(1_047_576, 32_768),
    "gpt-4.1-mini": CatalogEntry(1_047_576, 32_768),
    "gpt-4.1-nano": CatalogEntry(1_047_576, 32_768),
    "gpt-5": CatalogEntry(400 * _K, 128 * _K),
    "gpt-5-mini": CatalogEntry(400 * _K, 128 * _K),
    "gpt-5-nano": CatalogEntry(400 * _K, 128 * _K),
    "gpt-5-chat-latest": CatalogEntry(128 * _K, 16_384),
    "gpt-5.1": CatalogEntry(400 * _K, 128 * _K),
    "gpt-5.2": CatalogEntry(400 * _K, 128 * _K),
    "o3": CatalogEntry(200 * _K, 100 * _K),
    "o4-mini": CatalogEntry(200 * _K, 100 * _K),
}

_BEDROCK_OTHER: dict[str, CatalogEntry] = {
    "amazon.nova-premier": CatalogEntry(1_000_000, 10_000),
    "amazon.nova-pro": CatalogEntry(300 * _K, 10_000),
    "amazon.nova-lite": CatalogEntry(300 * _K, 10_000),
    "amazon.nova-micro": CatalogEntry(128 * _K, 10_000, images=False),
}

_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")
_BEDROCK_GEO = re.compile(r"^(?:us|eu|apac|global|jp|au|ca|us-gov)\.")
_BEDROCK_VERSION = re.compile(r"-v\d+(?::\d+[a-z]*)?$")

T = TypeVar("T")
#: Per-family tables of models: ``anthropic`` (Claude, on any provider), ``openai``, ``bedrock`` (others).
ModelFamilies = Mapping[str, Mapping[str, T]]
_FAMILIES: ModelFamilies[CatalogEntry] = {"anthropic": _CLAUDE, "openai": _OPENAI, "bedrock": _BEDROCK_OTHER}


def lookup_model(provider: str, model_id: str, families: ModelFamilies[T]) -> T | None:
    """``provider``'s ``model_id`` looked up in per-family tables (keys ``anthropic``, ``openai`` and
    ``bedrock``, the last for Bedrock models other than Claude), the one naming rule of the catalog and the
    price table: ids are case-insensitive; a dated id (``-20250929``) falls back to its family; a Bedrock
    id loses its inference-profile prefix (``us.``) and version suffix (``-v1:0``), and an
    ``anthropic.`` Bedrock model is looked up as Claude."""
    model = model_id.strip().lower()
    if provider == "bedrock":
        model = _BEDROCK_VERSION.sub("", _BEDROCK_GEO.sub("", model))
        if model.startswith("anthropic."):
            provider, model = "anthropic", model.removeprefix("anthropic.")
    table = families.get(provider)
    if table is None:
        return None
    if model in table:
        return table[model]
    return table.get(_DATE_SUFFIX.sub("", model))


def catalog_entry(provider: str, model_id: str) -> CatalogEntry | None:
    """The catalog's entry for ``provider``'s ``model_id``, or ``None`` when the model is unknown."""
    return lookup_model(provider, model_id, _FAMILIES)


def model_info(provider: str, model_id: str, *, context_window: int | None = None) -> ModelInfo:
    """What the engine needs to know about a model (see the module docstring for unknown models);
    ``context_window`` (``STEPAGENT_CONTEXT_WINDOW``) overrides the catalog's."""
    entry = catalog_entry(provider, model_id)
    if entry is None:
        return ModelInfo(
            model_id=model_id,
            context_window=context_window or DEFAULT_CONTEXT_WINDOW,
            max_output_tokens=DEFAULT_MAX_OUTPUT_TOKENS,
            provider=provider,
        )
    return ModelInfo(
        model_id=model_id,
        context_window=context_window or entry.context_window,
        max_output_tokens=entry.max_output_tokens,
        supports_image_input=entry.images,
        provider=provider,
    )


def bedrock_cache_ttl(model_id: str) -> bool:
    """Whether the model's ``cachePoint`` takes a ``ttl`` (the one-hour entry): Claude 4.5 and later."""
    entry = catalog_entry("bedrock", model_id)
    return entry is not None and entry.prompt_cache and entry.cache_ttl


def bedrock_prompt_cache(model_id: str) -> bool:
    """Whether to send ``cachePoint`` blocks: only to models known to accept them (Claude, Nova); an
    unknown model might reject the request with a ValidationException."""
    entry = catalog_entry("bedrock", model_id)
    return entry is not None and entry.prompt_cache
