"""Model usage as CloudWatch EMF: token, latency and error metrics with the dimensions ``model`` and
``profile``, tool latency per ``tool``; one EMF document per metric (one document has one dimension set),
from a step's own events only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_lambda_powertools import Metrics

from stepagent.aws.metrics import EmfMetrics, ModelTiming, publish_tool_latency, publish_usage
from stepagent.aws.worker import CountingMetrics
from stepagent.events import CompletionFinished, CompletionStarted, EventCollector, StepFailed, TurnComplete
from stepagent.providers.base import Usage
from stepagent.providers.prices import cost_usd, parse_prices


def emf_documents(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def metric_name(document: dict[str, Any]) -> str:
    return str(document["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"])


def test_usage_becomes_emf_documents_per_model_and_profile(capsys: pytest.CaptureFixture[str]) -> None:
    sink = EmfMetrics(Metrics(namespace="stepagent-test"))
    model = "anthropic:claude-sonnet-4-6"
    events = [
        CompletionFinished(usage=Usage(90, 4), step_usage=Usage(120, 9, 30, 5), model=model),
        TurnComplete(Usage(120, 9), model, "m1", 3),  # not counted twice
        CompletionFinished(usage=None, step_usage=None, model="openai:gpt-4.1"),  # no usage: no tokens
    ]
    publish_usage(sink, events, profile="support", latency_ms=1250.0)
    documents = emf_documents(capsys)
    assert [(metric_name(d), d["model"], d["profile"], d[metric_name(d)]) for d in documents] == [
        ("InputTokens", model, "support", [120.0]),
        ("OutputTokens", model, "support", [9.0]),
        ("CacheReadTokens", model, "support", [30.0]),
        ("CacheWriteTokens", model, "support", [5.0]),
        ("CostUsd", model, "support", [cost_usd(model, Usage(120, 9, 30, 5))]),  # the catalog's price
        ("ModelLatency", model, "support", [1250.0]),
        ("ModelLatency", "openai:gpt-4.1", "support", [1250.0]),
    ]
    for document in documents:
        directive = document["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "stepagent-test" and ["model", "profile"] in directive["Dimensions"]
        unit = {"ModelLatency": "Milliseconds", "CostUsd": "None"}.get(metric_name(document), "Count")
        assert directive["Metrics"][0]["Unit"] == unit


def test_a_model_failure_and_a_tool_run_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    sink = EmfMetrics(Metrics(namespace="stepagent-test"))
    failed = [CompletionFinished(step_usage=Usage(), model="m"), StepFailed("The model failed: x", False)]
    publish_usage(sink, failed)
    publish_tool_latency(sink, "get_weather", 42.0)
    documents = emf_documents(capsys)
    errors = [d for d in documents if metric_name(d) == "ModelErrors"]
    assert [(d["model"], d["profile"], d["ModelErrors"]) for d in errors] == [("m", "default", [1.0])]
    [tool] = [d for d in documents if metric_name(d) == "ToolLatency"]
    assert tool["tool"] == "get_weather" and tool["ToolLatency"] == [42.0]


def test_the_model_timing_observer_measures_the_model_phase() -> None:
    ticks = iter([10.0, 12.5])
    inner = EventCollector()
    timing = ModelTiming(inner, clock=lambda: next(ticks))
    timing.on_event("t", CompletionStarted())
    timing.on_event("t", CompletionFinished(model="m"))
    assert timing.latency_ms == 2500.0 and len(inner.events) == 2


def test_the_counting_sink_keeps_totals_and_per_model_counts() -> None:
    sink = CountingMetrics()
    publish_usage(sink, [CompletionFinished(step_usage=Usage(5, 2), model="m-a")] * 2)
    publish_usage(sink, [CompletionFinished(step_usage=Usage(1, 1), model="m-b")], profile="p")
    assert sink.counts["InputTokens"] == 11
    assert sink.counts["InputTokens[model=m-a,profile=default]"] == 10
    assert sink.counts["InputTokens[model=m-b,profile=p]"] == 1
    assert sink.counts["OutputTokens"] == 5
    assert sink.counts["CacheReadTokens"] == 0


def test_cost_follows_the_price_table_and_is_left_out_for_unpriced_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = EmfMetrics(Metrics(namespace="stepagent-test"))
    prices = parse_prices('{"openai:house-model": {"input": 2, "output": 10}}')
    publish_usage(
        sink,
        [CompletionFinished(step_usage=Usage(1_000_000, 100_000), model="openai:house-model")],
        prices=prices,
    )
    publish_usage(sink, [CompletionFinished(step_usage=Usage(10, 1), model="openai:nobody-priced-this")])
    costs = [(d["model"], d["CostUsd"]) for d in emf_documents(capsys) if metric_name(d) == "CostUsd"]
    assert costs == [("openai:house-model", [3.0])]  # 1M input at $2 + 100k output at $10 per million
