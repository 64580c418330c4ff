"""The price catalog, ``STEPAGENT_PRICES`` and the one cost function."""

from __future__ import annotations

import pytest

from stepagent.errors import ConfigurationError
from stepagent.providers.base import Usage
from stepagent.providers.prices import CATALOG_PRICES, ModelPrice, catalog_price, cost_usd, parse_prices
from stepagent.stores.base import UsageRecord
from stepagent.usage import summarize


def test_catalogued_models_resolve_through_snapshots_and_bedrock_prefixes() -> None:
    sonnet = catalog_price("anthropic:claude-sonnet-4-5")
    assert sonnet == ModelPrice(input=3.0, output=15.0, cache_read=0.30, cache_write=3.75)
    assert catalog_price("anthropic:claude-sonnet-4-5-20250929") == sonnet
    assert catalog_price("bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0") == sonnet
    assert catalog_price("openai:gpt-4o-2024-11-20") == catalog_price("openai:gpt-4o")
    assert catalog_price("bedrock:amazon.nova-pro-v1:0") is not None
    assert catalog_price("openai:house-model") is None
    assert catalog_price("scripted:/tmp/script.json") is None


def test_cost_counts_each_kind_of_token_at_its_rate() -> None:
    usage = Usage(
        input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=2_000_000, cache_write_tokens=0
    )
    # 3.00 input + 1.50 output + 0.60 cache reads
    assert cost_usd("anthropic:claude-sonnet-4-5", usage) == pytest.approx(5.10)
    assert cost_usd("openai:unknown-model", usage) is None
    assert CATALOG_PRICES.cost("openai:gpt-4o-mini", Usage(input_tokens=1000)) == pytest.approx(0.00015)


def test_overrides_win_and_missing_cache_rates_default_to_input() -> None:
    table = parse_prices(
        '{"openai:house-model": {"input": 1, "output": 2}, "openai:gpt-4o": {"input": 0, "output": 0}}'
    )
    assert table.price("openai:house-model") == ModelPrice(
        input=1.0, output=2.0, cache_read=1.0, cache_write=1.0
    )
    assert table.cost("openai:gpt-4o", Usage(input_tokens=10**6, output_tokens=10**6)) == 0.0
    assert table.price("anthropic:claude-haiku-4-5") == catalog_price("anthropic:claude-haiku-4-5")
    assert parse_prices("") is CATALOG_PRICES and parse_prices(None) is CATALOG_PRICES


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "STEPAGENT_PRICES is not valid JSON"),
        ("[1]", "STEPAGENT_PRICES must be a JSON object"),
        ('{"gpt-4o": {"input": 1, "output": 2}}', "'gpt-4o' is not <provider>:<model id>"),
        ('{"openai:x": 3}', "'openai:x' must be an object"),
        ('{"openai:x": {"input": 1}}', "'openai:x': output is required"),
        ('{"openai:x": {"input": -1, "output": 2}}', "input=-1 is invalid"),
        ('{"openai:x": {"input": 1, "output": "2"}}', "output='2' is invalid"),
        (
            '{"openai:x": {"input": 1, "output": 2, "cached": 1}}',
            "unknown field 'cached' (known: input, output, cache_read, cache_write)",
        ),
    ],
)
def test_bad_prices_are_reported_clearly(raw: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_prices(raw)
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_prices('{"openai:a": {"input": 1}, "openai:b": {"output": true, "input": 1}}')
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and "openai:a" in lines[0] and "openai:b" in lines[1]


def test_usage_reports_show_dollars_from_stored_costs_or_current_prices() -> None:
    stored = UsageRecord("m1", "anthropic:claude-haiku-4-5", 1000, 100, completions=1, cost_usd=0.5)
    older = UsageRecord("m2", "anthropic:claude-haiku-4-5", 1_000_000, 0, completions=1)  # priced now: $1
    unknown = UsageRecord("m3", "openai:house-model", 10, 10, completions=1)
    report = summarize("r", [("r", stored), ("r", older), ("c", unknown)])
    assert report.total.cost_usd == pytest.approx(1.5)
    assert report.models["openai:house-model"].cost_usd is None
    assert "cost_usd" not in report.as_dict()["models"]["openai:house-model"]
    assert report.as_dict()["total"]["cost_usd"] == 1.5
    lines = report.lines()
    assert lines[0].endswith(", $1.5000")
    assert any(
        line.strip() == "anthropic:claude-haiku-4-5: 1,001,000 in, 100 out, 2 calls, $1.5000"
        for line in lines
    )
    unpriced = summarize("x", [("x", unknown)])
    assert unpriced.lines()[1] == "  cost: unknown (no prices for these models; set STEPAGENT_PRICES)"


def test_a_price_built_in_python_is_checked_and_its_cache_rates_default_to_input() -> None:
    assert ModelPrice(input=2.0, output=8.0) == ModelPrice(input=2, output=8, cache_read=2, cache_write=2)
    with pytest.raises(ConfigurationError) as caught:
        ModelPrice(input=-1, output=float("inf"))
    assert str(caught.value).splitlines() == [
        "input=-1 is invalid: dollars per million tokens, a number >= 0",
        "output=inf is invalid: dollars per million tokens, a number >= 0",
    ]
