"""Token usage as CloudWatch EMF: ``InputTokens``/``OutputTokens`` with the dimension ``model``, one EMF
document per metric (one document has one dimension set), from a step's own events only."""

from __future__ import annotations

import json

import pytest
from aws_lambda_powertools import Metrics

from stepagent.aws.metrics import EmfMetrics, publish_usage
from stepagent.aws.worker import CountingMetrics
from stepagent.events import CompletionFinished, TurnComplete
from stepagent.providers.base import Usage


def test_usage_becomes_emf_documents_with_the_model_dimension(capsys: pytest.CaptureFixture[str]) -> None:
    sink = EmfMetrics(Metrics(namespace="stepagent-test"))
    events = [
        CompletionFinished(usage=Usage(90, 4), step_usage=Usage(120, 9), model="anthropic:claude-sonnet-4-6"),
        TurnComplete(Usage(120, 9), "anthropic:claude-sonnet-4-6", "m1", 3),  # not counted twice
        CompletionFinished(usage=None, step_usage=None, model="openai:gpt-4.1"),  # no usage: nothing
    ]
    publish_usage(sink, events)
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [(d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"], d["model"]) for d in documents] == [
        ("InputTokens", "anthropic:claude-sonnet-4-6"),
        ("OutputTokens", "anthropic:claude-sonnet-4-6"),
    ]
    assert [d[d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]] for d in documents] == [[120.0], [9.0]]
    for document in documents:
        directive = document["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "stepagent-test" and ["model"] in directive["Dimensions"]
        assert directive["Metrics"][0]["Unit"] == "Count"


def test_the_counting_sink_keeps_totals_and_per_model_counts() -> None:
    sink = CountingMetrics()
    publish_usage(sink, [CompletionFinished(step_usage=Usage(5, 2), model="m-a")] * 2)
    publish_usage(sink, [CompletionFinished(step_usage=Usage(1, 1), model="m-b")])
    assert sink.counts == {
        "InputTokens": 11,
        "InputTokens[model=m-a]": 10,
        "InputTokens[model=m-b]": 1,
        "OutputTokens": 5,
        "OutputTokens[model=m-a]": 4,
        "OutputTokens[model=m-b]": 1,
    }
