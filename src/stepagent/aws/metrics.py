"""Metrics of the worker and the tool runner: the CloudWatch EMF sink and what a step publishes.

Guarantees:

- :func:`publish_usage` adds, for every step that ran the model, the usage metrics of
  :func:`usage_metrics` (``InputTokens``, ``OutputTokens``, ``CacheReadTokens``, ``CacheWriteTokens``,
  unit ``Count``; and ``CostUsd``, dollars, when the model's prices are known), ``ModelLatency`` (milliseconds from the step's first model request to its last answer,
  inline tools included) and ``ModelErrors`` (a model failure the step gave up on), each with the
  dimensions ``model`` (``<provider>:<model id>``) and ``profile`` (the conversation's agent profile,
  ``default`` for none) — once per step that ran the model, from the step's own observer events, so a
  redelivery that runs no model adds nothing.
- :func:`publish_tool_latency` adds ``ToolLatency`` (milliseconds) with the dimension ``tool``.
- :class:`EmfMetrics` adapts powertools ``Metrics`` to the sinks: undimensioned counters go to the
  invocation's metric set (flushed after each invocation); a dimensioned metric is written at once as its
  own EMF document (``single_metric``), since one EMF document has one dimension set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from stepagent.events import AgentEvent, CompletionFinished, CompletionStarted, Observer, StepFailed
from stepagent.providers.base import Usage
from stepagent.providers.prices import CATALOG_PRICES, PriceTable

INPUT_TOKENS, OUTPUT_TOKENS = "InputTokens", "OutputTokens"
CACHE_READ_TOKENS, CACHE_WRITE_TOKENS = "CacheReadTokens", "CacheWriteTokens"
MODEL_LATENCY, MODEL_ERRORS, TOOL_LATENCY = "ModelLatency", "ModelErrors", "ToolLatency"
COST_USD = "CostUsd"
#: The ``profile`` dimension of a conversation without one.
DEFAULT_PROFILE = "default"


class DimensionedSink(Protocol):
    """The part of the worker's ``MetricsSink`` that takes metrics with dimensions."""

    def add_dimensioned_metric(
        self, name: str, unit: str, value: float, dimensions: Mapping[str, str]
    ) -> Any: ...


def usage_metrics(
    model: str, usage: Usage, prices: PriceTable = CATALOG_PRICES
) -> list[tuple[str, str, float]]:
    """``(name, unit, value)`` of one step's model usage: every metric that is a function of the usage,
    the cost in dollars (at ``prices``) included when the model's prices are known."""
    metrics: list[tuple[str, str, float]] = [
        (INPUT_TOKENS, "Count", usage.input_tokens),
        (OUTPUT_TOKENS, "Count", usage.output_tokens),
        (CACHE_READ_TOKENS, "Count", usage.cache_read_tokens),
        (CACHE_WRITE_TOKENS, "Count", usage.cache_write_tokens),
    ]
    cost = prices.cost(model, usage)
    if cost is not None:
        metrics.append((COST_USD, "None", cost))
    return metrics


class ModelTiming:
    """An observer (in front of another) that times a step's model phase: :attr:`latency_ms` is the time
    from its ``CompletionStarted`` to its ``CompletionFinished``."""

    def __init__(self, inner: Observer, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.clock = clock
        self._started: float | None = None
        self.latency_ms: float | None = None

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        if isinstance(event, CompletionStarted):
            self._started = self.clock()
        elif isinstance(event, CompletionFinished) and self._started is not None:
            self.latency_ms = (self.clock() - self._started) * 1000.0
        self.inner.on_event(thread_id, event)


def publish_usage(
    sink: DimensionedSink,
    events: Iterable[AgentEvent],
    *,
    profile: str | None = None,
    latency_ms: float | None = None,
    prices: PriceTable = CATALOG_PRICES,
) -> None:
    """The model metrics of one step's ``events`` (see the module docstring)."""
    events = list(events)
    failed = any(isinstance(e, StepFailed) and not e.retrying for e in events)
    for event in events:
        if not isinstance(event, CompletionFinished) or not event.model:
            continue
        dimensions = {"model": event.model, "profile": profile or DEFAULT_PROFILE}
        if event.step_usage is not None:
            for name, unit, value in usage_metrics(event.model, event.step_usage, prices):
                sink.add_dimensioned_metric(name, unit, value, dimensions)
        if latency_ms is not None:
            sink.add_dimensioned_metric(MODEL_LATENCY, "Milliseconds", latency_ms, dimensions)
        if failed:
            sink.add_dimensioned_metric(MODEL_ERRORS, "Count", 1, dimensions)


def publish_tool_latency(sink: DimensionedSink, tool: str, latency_ms: float) -> None:
    """``ToolLatency`` of one tool run."""
    sink.add_dimensioned_metric(TOOL_LATENCY, "Milliseconds", latency_ms, {"tool": tool})


class EmfMetrics:
    """The worker's ``MetricsSink`` over powertools ``Metrics`` (CloudWatch EMF)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.metrics.add_metric(name=name, unit=MetricUnit(unit), value=value)

    def add_dimensioned_metric(
        self, name: str, unit: str, value: float, dimensions: Mapping[str, str]
    ) -> None:
        with single_metric(
            name=name, unit=MetricUnit(unit), value=value, namespace=self.metrics.namespace
        ) as metric:
            for key, dimension in dimensions.items():
                metric.add_dimension(name=key, value=dimension)

    def flush_metrics(self) -> Any:
        return self.metrics.flush_metrics()
