"""Metrics of the worker: the CloudWatch EMF sink and the token-usage metrics.

Guarantees:

- :func:`publish_usage` adds, for every completion a step ran, ``InputTokens`` and ``OutputTokens``
  (unit ``Count``) with the dimension ``model`` (``<provider>:<model id>``) — once per step that ran the
  model, from the step's own observer events, so a redelivery that runs no model adds nothing.
- :class:`EmfMetrics` adapts powertools ``Metrics`` to the worker's sink: undimensioned counters go to
  the invocation's metric set (flushed after each invocation, as before); a dimensioned metric is written
  at once as its own EMF document (``single_metric``), since one EMF document has one dimension set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from stepagent.events import AgentEvent, CompletionFinished

INPUT_TOKENS, OUTPUT_TOKENS = "InputTokens", "OutputTokens"


class DimensionedSink(Protocol):
    """The part of the worker's ``MetricsSink`` that takes metrics with dimensions."""

    def add_dimensioned_metric(
        self, name: str, unit: str, value: float, dimensions: Mapping[str, str]
    ) -> Any: ...


def publish_usage(sink: DimensionedSink, events: Iterable[AgentEvent]) -> None:
    """Token metrics for the completions among ``events`` (see the module docstring)."""
    for event in events:
        if isinstance(event, CompletionFinished) and event.step_usage is not None and event.model:
            dimensions = {"model": event.model}
            sink.add_dimensioned_metric(INPUT_TOKENS, "Count", event.step_usage.input_tokens, dimensions)
            sink.add_dimensioned_metric(OUTPUT_TOKENS, "Count", event.step_usage.output_tokens, dimensions)


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
