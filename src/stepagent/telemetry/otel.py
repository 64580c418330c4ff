"""The tracing port on the OpenTelemetry SDK, exporting OTLP over HTTP when the handler asks.

Imported only when telemetry is on (:mod:`stepagent.telemetry`). Guarantees:

- **Spans of the port, in the trace they belong to.** A span's parent is the W3C ``traceparent`` the port
  hands over (a remote parent: another invocation, another process); without one, a new trace whose id is
  derived from the seed (SHA-256), so a redelivered input re-emits its spans into the same trace.
- **Nothing leaves the process while a step runs.** Ended spans are kept in memory (at most
  :data:`MAX_BUFFERED` per invocation; more are dropped with one warning) and :meth:`OtelTracer.flush`
  exports them in one OTLP/HTTP request, after the handler's work and before it returns (Lambda freezes
  the process afterwards).
- **Bounded and harmless.** The export, retries included, ends within the exporter's timeout:
  ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` / ``OTEL_EXPORTER_OTLP_TIMEOUT`` (seconds), else
  :data:`DEFAULT_EXPORT_TIMEOUT_S`. A collector that is down, slow or refusing costs at most that and a
  warning: :meth:`~OtelTracer.flush` never raises, and the spans of that invocation are dropped.
- The process-wide OpenTelemetry globals (tracer provider, propagators) are left alone: stepagent's spans
  go only to its own provider.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from stepagent.telemetry.switches import captures_content
from stepagent.tracing import Attributes, valid_traceparent

log = logging.getLogger(__name__)

DEFAULT_EXPORT_TIMEOUT_S = 2.0
MAX_BUFFERED = 10_000
_TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

_seed: ContextVar[str | None] = ContextVar("stepagent_trace_seed", default=None)


class _SeededIds(RandomIdGenerator):
    """Random span ids; a root span's trace id comes from the seed of the span being started, if any."""

    def generate_trace_id(self) -> int:
        seed = _seed.get()
        if seed is None:
            return super().generate_trace_id()
        return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:16], "big") or 1


class SpanBuffer(SpanProcessor):
    """Keeps ended spans until :meth:`take` (thread-safe: a tool may end spans from a worker thread)."""

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        self._spans: list[ReadableSpan] = []
        self._lock = threading.Lock()
        self._limit = limit
        self._warned = False

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            if len(self._spans) < self._limit:
                self._spans.append(span)
                return
        if not self._warned:
            self._warned = True
            log.warning("more than %d trace spans in one invocation: the rest are dropped", self._limit)

    def take(self) -> list[ReadableSpan]:
        with self._lock:
            spans, self._spans = self._spans, []
        return spans

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The remote span context of a W3C ``traceparent``, or ``None`` if it is absent or malformed."""
    valid = valid_traceparent(value)
    if valid is None:
        return None
    _, trace_id, span_id, flags = valid.split("-")
    context = SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(int(flags, 16)))
    return context if context.is_valid else None


def format_traceparent(context: SpanContext) -> str:
    """The W3C ``traceparent`` of ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span
        context = span.get_span_context()
        self.traceparent = format_traceparent(context) if context.is_valid else None

    def set_attributes(self, attributes: Attributes) -> None:
        self._span.set_attributes(dict(attributes))

    def record_error(self, error: BaseException) -> None:
        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    def end(self) -> None:
        self._span.end()


def _kind(name: str) -> SpanKind:
    if name.startswith("chat "):
        return SpanKind.CLIENT
    return SpanKind.INTERNAL


def export_timeout(environ: Mapping[str, str]) -> float:
    """The bound on one export, retries included, in seconds (see the module docstring)."""
    for name in _TIMEOUT_VARIABLES:
        raw = environ.get(name, "").strip()
        if raw:
            try:
                return max(float(raw), 0.001)
            except ValueError:
                log.warning("%s=%r is not a number of seconds; using %s", name, raw, DEFAULT_EXPORT_TIMEOUT_S)
    return DEFAULT_EXPORT_TIMEOUT_S


def resource_from_env() -> Resource:
    """``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, with ``service.name`` = ``stepagent`` when
    neither names the service."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "stepagent"}))
    return resource


class OtelTracer:
    """The :class:`~stepagent.tracing.Tracer` port on an SDK tracer provider of its own."""

    def __init__(
        self,
        exporter: SpanExporter | None,
        *,
        resource: Resource | None = None,
        capture_content: bool = False,
    ) -> None:
        self.exporter = exporter
        self.capture_content = capture_content
        self.buffer = SpanBuffer()
        self.provider = TracerProvider(
            resource=resource if resource is not None else resource_from_env(), id_generator=_SeededIds()
        )
        self.provider.add_span_processor(self.buffer)
        self._tracer = self.provider.get_tracer("stepagent")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, headers: str | None = None) -> OtelTracer:
        """An OTLP/HTTP exporter configured by the standard ``OTEL_*`` variables; ``headers`` (the
        ``OTEL_EXPORTER_OTLP_HEADERS`` format) replaces theirs."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.util.re import parse_env_headers

        env = os.environ if environ is None else environ
        parsed = parse_env_headers(headers, liberal=True) if headers else None
        exporter = OTLPSpanExporter(timeout=export_timeout(env), headers=parsed)
        return cls(exporter, capture_content=captures_content(env))

    def start_span(
        self, name: str, attributes: Attributes, parent: str | None, seed: str | None = None
    ) -> _OtelSpan:
        remote = parse_traceparent(parent)
        context = trace.set_span_in_context(NonRecordingSpan(remote)) if remote is not None else Context()
        token = _seed.set(seed if remote is None else None)
        try:
            span = self._tracer.start_span(
                name, context=context, kind=_kind(name), attributes=dict(attributes)
            )
        finally:
            _seed.reset(token)
        return _OtelSpan(span)

    def take(self) -> list[ReadableSpan]:
        """The ended spans not yet exported (they are no longer kept)."""
        return self.buffer.take()

    def flush(self) -> bool:
        """Export the ended spans in one request; ``False`` (and a warning) if that failed or there is no
        exporter. Bounded by the exporter's timeout; never raises."""
        spans = self.take()
        if not spans or self.exporter is None:
            return not spans
        return export(self.exporter, spans)


def export(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> bool:
    """Export ``spans``; ``False`` and a warning when that failed (never raises)."""
    try:
        result: Any = exporter.export(spans)
    except Exception:
        log.warning("could not export %d trace spans", len(spans), exc_info=True)
        return False
    if result is not SpanExportResult.SUCCESS:
        log.warning("the trace collector did not take %d spans; they are dropped", len(spans))
        return False
    return True
