"""Build a ``ModelProvider`` from ``STEPAGENT_MODEL`` (``<provider>:<model id>``) and the environment.

Guarantees:

- ``anthropic:<model>`` needs ``ANTHROPIC_API_KEY`` (``ANTHROPIC_BASE_URL`` optional); ``openai:<model>``
  needs ``OPENAI_API_KEY`` (``OPENAI_BASE_URL`` optional, for any compatible endpoint; endpoints without
  authentication accept any non-empty key); ``bedrock:<model id>`` uses the AWS credential chain, the
  region from ``AWS_REGION``/``AWS_DEFAULT_REGION`` (default ``us-east-1``) and only the service-specific
  ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` (not the global ``AWS_ENDPOINT_URL``, which points the stores at
  moto or LocalStack); ``scripted:<path>`` loads a script file.
- A missing key, an unknown provider or an empty model id raises
  :class:`~stepagent.errors.ConfigurationError` naming the variable, at construction time, so a
  misconfigured worker fails at cold start rather than on the first message.
- Model limits come from the catalog; ``context_window`` (``STEPAGENT_CONTEXT_WINDOW``) overrides its
  window. A model the catalog does not know, without that override, gets the catalog's conservative
  default window (never 0: compaction stays on) and a warning naming the setting, logged once per
  model at construction (start).
- Nothing here touches the network.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from stepagent.errors import ConfigurationError
from stepagent.providers.base import ModelProvider
from stepagent.providers.catalog import (
    DEFAULT_CONTEXT_WINDOW,
    bedrock_cache_ttl,
    bedrock_prompt_cache,
    catalog_entry,
    model_info,
)

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-6"
DEFAULT_OPENAI_MODEL = "gpt-4.1"
PROVIDERS = ("anthropic", "openai", "bedrock", "scripted")

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _require(environ: Mapping[str, str], name: str, model: str) -> str:
    value = _get(environ, name)
    if value is None:
        raise ConfigurationError(f"{name} is not set; it is required for STEPAGENT_MODEL={model}")
    return value


def make_provider(
    model: str,
    *,
    environ: Mapping[str, str] | None = None,
    http_client: httpx.AsyncClient | None = None,
    context_window: int | None = None,
) -> ModelProvider:
    """The provider for ``model`` (``<provider>:<model id>``), configured from ``environ`` (default:
    ``os.environ``). ``http_client`` is used by the HTTP providers instead of their own (tests);
    ``context_window`` overrides the catalog's window (a scripted model's comes from its script)."""
    env = os.environ if environ is None else environ
    provider, sep, model_id = model.strip().partition(":")
    model_id = model_id.strip()
    if not sep or provider not in PROVIDERS:
        raise ConfigurationError(
            f"STEPAGENT_MODEL={model!r} is invalid: expected <provider>:<model id> with provider one of "
            f"{', '.join(PROVIDERS)} (e.g. anthropic:{DEFAULT_ANTHROPIC_MODEL})"
        )
    if not model_id:
        raise ConfigurationError(f"STEPAGENT_MODEL={model!r} is invalid: the model id after ':' is empty")
    if provider != "scripted" and context_window is None and catalog_entry(provider, model_id) is None:
        warn_unknown_model(f"{provider}:{model_id}")
    if provider == "anthropic":
        from stepagent.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            model_id,
            api_key=_require(env, "ANTHROPIC_API_KEY", model),
            info=model_info("anthropic", model_id, context_window=context_window),
            base_url=_get(env, "ANTHROPIC_BASE_URL"),
            http_client=http_client,
        )
    if provider == "openai":
        from stepagent.providers.openai_compat import OpenAIProvider

        return OpenAIProvider(
            model_id,
            api_key=_require(env, "OPENAI_API_KEY", model),
            info=model_info("openai", model_id, context_window=context_window),
            base_url=_get(env, "OPENAI_BASE_URL"),
            http_client=http_client,
        )
    if provider == "bedrock":
        import aioboto3

        from stepagent.providers.bedrock import BedrockProvider

        region = _get(env, "AWS_REGION") or _get(env, "AWS_DEFAULT_REGION") or "us-east-1"
        # Keys given in an explicit mapping are used; otherwise boto3's usual chain (env, profile, role).
        session = aioboto3.Session(
            region_name=region,
            aws_access_key_id=_get(env, "AWS_ACCESS_KEY_ID") if environ is not None else None,
            aws_secret_access_key=_get(env, "AWS_SECRET_ACCESS_KEY") if environ is not None else None,
            aws_session_token=_get(env, "AWS_SESSION_TOKEN") if environ is not None else None,
        )
        return BedrockProvider(
            model_id,
            info=model_info("bedrock", model_id, context_window=context_window),
            region=region,
            endpoint_url=_get(env, "AWS_ENDPOINT_URL_BEDROCK_RUNTIME"),
            session=session,
            prompt_cache=bedrock_prompt_cache(model_id),
            cache_ttl=bedrock_cache_ttl(model_id),
        )
    from stepagent.providers.scripted import ScriptedProvider

    return ScriptedProvider(model_id)


def warn_unknown_model(model: str) -> None:
    """Log, once per process and model, that ``model`` is not in the catalog and gets the default window."""
    if model in _warned:
        return
    _warned.add(model)
    log.warning(
        "model %s is not in stepagent's catalog: assuming a %d-token context window for compaction and "
        "truncation; set STEPAGENT_CONTEXT_WINDOW to its real window",
        model,
        DEFAULT_CONTEXT_WINDOW,
    )


def detect_default_model(environ: Mapping[str, str] | None = None) -> str | None:
    """The model ``stepagent run`` uses when none is configured: Anthropic when ``ANTHROPIC_API_KEY`` is
    set, else OpenAI when ``OPENAI_API_KEY`` is set, else ``None`` (the caller falls back to the demo)."""
    env = os.environ if environ is None else environ
    if _get(env, "ANTHROPIC_API_KEY"):
        return f"anthropic:{DEFAULT_ANTHROPIC_MODEL}"
    if _get(env, "OPENAI_API_KEY"):
        return f"openai:{DEFAULT_OPENAI_MODEL}"
    return None
