"""Synchronous Lambda entry points for the worker, the tool runner and the timer relay.

Guarantees:

- Importing this module is cheap: settings, clients, the model and the toolset are built on the first
  invocation (cold start) and kept for the life of the process, one :class:`AwsRuntime` per role.
- Every invocation runs on one persistent event loop. The AWS clients (aiohttp connectors), the model's
  client and the runtime's locks belong to the loop that made them, so a new loop per invocation would
  break them (and re-pay the cold start: new clients, new TLS contexts, new connections).
- A configuration error fails the invocation with one clear message and is not cached: the next
  invocation tries again (e.g. after the environment was fixed by a redeploy).
- Logs carry the request id; metrics are flushed (EMF) after each invocation, token metrics per model as
  they happen.
- Traces (OpenTelemetry, only when the standard ``OTEL_*`` variables enable it: :mod:`stepagent.telemetry`)
  are exported after each invocation, before it returns, within the export timeout; an export that fails
  is logged and never fails or retries the invocation. With telemetry off nothing of OpenTelemetry is
  imported.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from aws_lambda_powertools import Logger, Metrics

from stepagent import telemetry
from stepagent.aws.clients import aws_session
from stepagent.aws.lambda_events import BatchResponse, SqsEvent
from stepagent.aws.layer_check import check_layer
from stepagent.aws.log_keys import LogKeys
from stepagent.aws.metrics import EmfMetrics
from stepagent.aws.runtime import TIMER_RELAY, TOOL_RUNNER, WORKER, AwsRuntime, RemainingMs
from stepagent.aws.secrets import read_secret
from stepagent.aws.settings import Settings

if TYPE_CHECKING:
    from stepagent.telemetry.otel import OtelTracer

#: Names the secret holding the OTLP exporter's headers (``key=value,...``): a deployment keeps API keys
#: of its trace backend out of the function's configuration.
OTLP_HEADERS_SECRET_ID = "STEPAGENT_OTLP_HEADERS_SECRET_ID"

#: The one powertools logger: JSON lines for CloudWatch on the ``stepagent`` logger, which every module's
#: ``logging.getLogger(__name__)`` records reach; the task's keys (:mod:`stepagent.aws.log_keys`) join them.
logger = Logger(service="stepagent")
logger.registered_handler.addFilter(LogKeys())

Handler = Callable[[dict[str, Any], Any], BatchResponse]

_loop: asyncio.AbstractEventLoop | None = None
_runtimes: dict[str, AwsRuntime] = {}
_handlers: dict[str, Handler] = {}
_metrics: EmfMetrics | None = None


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    return _loop


def metrics() -> EmfMetrics:
    """The process's one EMF metrics sink, created on first use (namespace ``POWERTOOLS_METRICS_NAMESPACE``,
    else ``stepagent``)."""
    global _metrics
    if _metrics is None:
        namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "stepagent"
        _metrics = EmfMetrics(Metrics(namespace=namespace))
    return _metrics


def tracer() -> OtelTracer | None:
    """The process's OpenTelemetry tracer, or ``None`` when the ``OTEL_*`` variables leave telemetry off
    (then nothing of OpenTelemetry is imported). The exporter's headers come from the secret named by
    ``STEPAGENT_OTLP_HEADERS_SECRET_ID`` when it is set (read once, at cold start)."""
    if not telemetry.enabled():
        return None
    secret_id = os.environ.get(OTLP_HEADERS_SECRET_ID, "").strip()
    headers = None
    if secret_id:
        settings = Settings.from_env()
        read = read_secret(settings, aws_session(settings), OTLP_HEADERS_SECRET_ID, secret_id)
        headers = event_loop().run_until_complete(read)
    return telemetry.process_tracer(headers)


def runtime(role: str) -> AwsRuntime:
    """The runtime for ``role``, built on first use (cold start)."""
    built = _runtimes.get(role)
    if built is None:
        check_layer()
        built = event_loop().run_until_complete(
            AwsRuntime.create(roles=[role], metrics=metrics(), tracer=tracer())
        )
        _runtimes[role] = built
    return built


def _remaining(context: Any) -> RemainingMs | None:
    getter = getattr(context, "get_remaining_time_in_millis", None)
    return getter if callable(getter) else None


def _handler(role: str) -> Handler:
    handler = _handlers.get(role)
    if handler is not None:
        return handler

    def invoke(raw: dict[str, Any], context: Any) -> BatchResponse:
        built = runtime(role)
        # Lambda's SQS event, as it arrives: the handlers check every value they read.
        event = cast(SqsEvent, raw)
        logger.append_keys(aws_request_id=getattr(context, "aws_request_id", None), role=role)
        if role == WORKER:
            call = built.handle_sqs_batch(event, _remaining(context))
        elif role == TOOL_RUNNER:
            call = built.handle_tool_batch(event, _remaining(context))
        else:
            call = built.handle_delay_batch(event, _remaining(context))
        try:
            return event_loop().run_until_complete(call)
        finally:
            with warnings.catch_warnings():
                # An invocation that counted nothing (an empty relay batch) is normal, not a warning.
                warnings.filterwarnings("ignore", message="No application metrics to publish")
                metrics().flush_metrics()
            telemetry.flush()

    _handlers[role] = invoke
    return invoke


def worker_handler(event: dict[str, Any], context: Any) -> BatchResponse:
    """SQS FIFO input batch → steps. Returns ``{"batchItemFailures": [...]}``."""
    return _handler(WORKER)(event, context)


def tool_runner_handler(event: dict[str, Any], context: Any) -> BatchResponse:
    """Tool-queue batch → function-tool runs → results on the input queue."""
    return _handler(TOOL_RUNNER)(event, context)


def timer_relay_handler(event: dict[str, Any], context: Any) -> BatchResponse:
    """Delay-queue batch → wake-ups on the input queue."""
    return _handler(TIMER_RELAY)(event, context)


def reset() -> None:
    """Close every runtime and the loop (tests; a Lambda process never needs this)."""
    global _loop
    if _loop is not None and not _loop.is_closed():
        for built in _runtimes.values():
            _loop.run_until_complete(built.aclose())
        _loop.close()
    _runtimes.clear()
    _handlers.clear()
    _loop = None
    telemetry.reset()
