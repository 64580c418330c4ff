"""List prices of the catalogued models and the one function that turns token usage into dollars.

``cost_usd("anthropic:claude-sonnet-4-5", usage)`` is what ``turn_complete.usage.cost_usd``, ``stepagent
usage``, the conversation cost limit and the metrics all use, so a conversation's cost is the same number
everywhere it is shown.

Guarantees:

- Prices are dollars per million tokens, four rates per model: ``input`` (uncached input), ``output``,
  ``cache_read`` and ``cache_write`` (prompt-cache reads and writes, which providers report apart from
  input). A model is named as ``STEPAGENT_MODEL`` names it (``<provider>:<model id>``); dated snapshots,
  Bedrock inference-profile prefixes and version suffixes resolve to their family as in the model catalog.
- ``STEPAGENT_PRICES`` (:func:`parse_prices`) adds or replaces entries: a JSON object
  ``{"<provider:model>": {"input": ..., "output": ..., "cache_read": ..., "cache_write": ...}}``;
  ``input`` and ``output`` are required, a missing cache rate defaults to the input rate. Every problem
  is reported at once, one line each, naming the entry and the field.
- An unknown model has no price: :meth:`PriceTable.cost` returns ``None``, never a guess.
- The catalog's figures are the vendors' public list prices at the time of writing (standard tier, the
  5-minute cache write for Anthropic); a deployment with other terms sets its own with ``STEPAGENT_PRICES``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator

from stepagent.config_errors import ConfigModel, Setting, error_lines
from stepagent.errors import ConfigurationError
from stepagent.providers.base import Usage
from stepagent.providers.catalog import ModelFamilies, lookup_model

PRICES_SETTING = "STEPAGENT_PRICES"
_MILLION = 1_000_000


_RATE = "dollars per million tokens"
#: A rate: its line, when wrong, is ``<field>=<value> is invalid: dollars per million tokens, a number >= 0``.
Rate = Annotated[float, Field(ge=0, allow_inf_nan=False), Setting(None, f"{_RATE}, a number >= 0")]
_CACHE_RATES = ("cache_read", "cache_write")


class ModelPrice(ConfigModel):
    """Dollars per million tokens: uncached input, output, prompt-cache reads and writes (a cache rate not
    given is the input rate)."""

    missing_words = f"{{key}} is required ({_RATE})"
    unknown_words = "unknown field {key!r} (known: {allowed})"
    input: Rate
    output: Rate
    cache_read: Rate = Field(default_factory=lambda rates: rates.get("input", 0.0))
    cache_write: Rate = Field(default_factory=lambda rates: rates.get("input", 0.0))

    @model_validator(mode="before")
    @classmethod
    def _null_cache_rates(cls, data: Any) -> Any:
        """A cache rate written as ``null`` is not given."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if not (key in _CACHE_RATES and value is None)}
        return data

    def cost(self, usage: Usage) -> float:
        """The dollars ``usage`` costs at these rates (rounded to a millionth of a cent)."""
        total = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * self.cache_read
            + usage.cache_write_tokens * self.cache_write
        ) / _MILLION
        return round(total, 8)


def _p(input: float, output: float, cache_read: float, cache_write: float | None = None) -> ModelPrice:
    # The catalog's own figures need no check: constructed without validation, at import.
    cache_write = input if cache_write is None else cache_write
    return ModelPrice.model_construct(
        input=input, output=output, cache_read=cache_read, cache_write=cache_write
    )


# Anthropic list prices (base input, output, cache hits, 5-minute cache writes), from
# https://docs.anthropic.com/en/docs/about-claude/pricing . Claude on Bedrock is billed at the same rates.
_CLAUDE: dict[str, ModelPrice] = {
    "claude-opus-4-6": _p(5.0, 25.0, 0.50, 6.25),
    "claude-opus-4-5": _p(5.0, 25.0, 0.50, 6.25),
    "claude-opus-4-1": _p(15.0, 75.0, 1.50, 18.75),
    "claude-opus-4": _p(15.0, 75.0, 1.50, 18.75),
    "claude-sonnet-4-6": _p(3.0, 15.0, 0.30, 3.75),
    "claude-sonnet-4-5": _p(3.0, 15.0, 0.30, 3.75),
    "claude-sonnet-4": _p(3.0, 15.0, 0.30, 3.75),
    "claude-3-7-sonnet": _p(3.0, 15.0, 0.30, 3.75),
    "claude-haiku-4-5": _p(1.0, 5.0, 0.10, 1.25),
    "claude-3-5-haiku": _p(0.80, 4.0, 0.08, 1.0),
}

# OpenAI list prices (input, output, cached input; OpenAI charges no cache write), from
# https://developers.openai.com/api/docs/pricing (standard tier).
_OPENAI: dict[str, ModelPrice] = {
    "gpt-4o": _p(2.50, 10.0, 1.25),
    "chatgpt-4o-latest": _p(5.0, 15.0, 5.0),
    "gpt-4o-mini": _p(0.15, 0.60, 0.075),
    "gpt-4.1": _p(2.0, 8.0, 0.50),
    "gpt-4.1-mini": _p(0.40, 1.60, 0.10),
    "gpt-4.1-nano": _p(0.10, 0.40, 0.025),
    "gpt-5": _p(1.25, 10.0, 0.125),
    "gpt-5-mini": _p(0.25, 2.0, 0.025),
    "gpt-5-nano": _p(0.05, 0.40, 0.005),
    "gpt-5-chat-latest": _p(1.25, 10.0, 0.125),
    "gpt-5.1": _p(1.25, 10.0, 0.125),
    "o3": _p(2.0, 8.0, 0.50),
    "o4-mini": _p(1.10, 4.40, 0.275),
}

# Amazon Nova on-demand prices (input, output, cache reads; cache writes are not charged extra), from
# https://aws.amazon.com/bedrock/pricing/ (us-east-1).
_NOVA: dict[str, ModelPrice] = {
    "amazon.nova-premier": _p(2.50, 12.50, 0.625),
    "amazon.nova-pro": _p(0.80, 3.20, 0.20),
    "amazon.nova-lite": _p(0.06, 0.24, 0.015),
    "amazon.nova-micro": _p(0.035, 0.14, 0.00875),
}

_FAMILIES: ModelFamilies[ModelPrice] = {"anthropic": _CLAUDE, "openai": _OPENAI, "bedrock": _NOVA}


def catalog_price(model: str) -> ModelPrice | None:
    """The catalog's list price of ``model`` (``<provider>:<model id>``), or ``None`` when unknown; ids are
    matched by the model catalog's naming rule (:func:`stepagent.providers.catalog.lookup_model`)."""
    provider, _, model_id = model.partition(":")
    return lookup_model(provider, model_id, _FAMILIES)


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The catalog's prices plus ``overrides`` (``STEPAGENT_PRICES``), which win for the models they name."""

    overrides: Mapping[str, ModelPrice] | None = None

    def price(self, model: str) -> ModelPrice | None:
        """The rates of ``model`` (``<provider>:<model id>``), or ``None`` when nobody priced it."""
        if self.overrides and model in self.overrides:
            return self.overrides[model]
        return catalog_price(model)

    def cost(self, model: str, usage: Usage) -> float | None:
        """What ``usage`` of ``model`` cost in dollars, or ``None`` when its prices are unknown."""
        price = self.price(model)
        return None if price is None else price.cost(usage)


#: The catalog alone (no ``STEPAGENT_PRICES``).
CATALOG_PRICES = PriceTable()


def cost_usd(model: str, usage: Usage, prices: PriceTable = CATALOG_PRICES) -> float | None:
    """What ``usage`` of ``model`` cost in dollars at ``prices`` (``None``: prices unknown)."""
    return prices.cost(model, usage)


def parse_prices(raw: str | None) -> PriceTable:
    """The :class:`PriceTable` ``STEPAGENT_PRICES`` describes (unset or empty: the catalog alone)."""
    if raw is None or not raw.strip():
        return CATALOG_PRICES
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{PRICES_SETTING} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(
            f'{PRICES_SETTING} must be a JSON object like {{"openai:gpt-4o": {{"input": 2.5, "output": 10}}}}'
        )
    problems: list[str] = []
    prices: dict[str, ModelPrice] = {}
    for model, rates in data.items():
        where = f"{PRICES_SETTING}: {model!r}"
        if ":" not in model:
            problems.append(f"{where} is not <provider>:<model id> (e.g. 'anthropic:claude-sonnet-4-5')")
        if not isinstance(rates, dict):
            problems.append(f"{where} must be an object with {', '.join(ModelPrice.model_fields)}")
            continue
        try:
            prices[model] = ModelPrice.model_validate(rates)
        except ValidationError as error:
            problems += error_lines(error, ModelPrice, prefix=f"{where}: ")
    if problems:
        raise ConfigurationError("\n".join(problems))
    return PriceTable(prices)
