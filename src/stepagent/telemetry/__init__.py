"""Whether OpenTelemetry is on, and the process's one tracer — without importing OpenTelemetry when off.

Guarantees:

- **Off unless the standard variables say so.** :func:`enabled` is true only when
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and
  ``OTEL_SDK_DISABLED`` is not ``true``, and ``OTEL_TRACES_EXPORTER`` is not ``none``). Nothing else reads
  the variables (:mod:`stepagent.telemetry.switches` does, for this module and the tracer alike), so with
  them unset :func:`tracer_from_env` returns ``None`` and no OpenTelemetry module is ever imported (the
  cold start pays nothing).
- **One tracer per process** (:func:`process_tracer`): built at first use from ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS`` and the endpoint, exporting OTLP over HTTP
  (:mod:`stepagent.telemetry.otel`). :func:`flush` exports what the invocation recorded, bounded by the
  export timeout, and never raises.
- ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` lets spans carry message content; anything
  else keeps it off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from stepagent.telemetry.switches import CAPTURE_CONTENT, ENDPOINT_VARIABLES, captures_content, enabled

if TYPE_CHECKING:
    from stepagent.telemetry.otel import OtelTracer

__all__ = [
    "CAPTURE_CONTENT",
    "ENDPOINT_VARIABLES",
    "captures_content",
    "enabled",
    "flush",
    "process_tracer",
    "reset",
    "tracer_from_env",
]

log = logging.getLogger(__name__)

_process: OtelTracer | None = None
_built = False


def tracer_from_env(
    environ: Mapping[str, str] | None = None, *, headers: str | None = None
) -> OtelTracer | None:
    """A new OTLP tracer if the environment enables one, else ``None`` (nothing imported). ``headers``
    (``key=value,...``, as ``OTEL_EXPORTER_OTLP_HEADERS``) replaces the environment's export headers."""
    if not enabled(environ):
        return None
    from stepagent.telemetry.otel import OtelTracer

    return OtelTracer.from_env(environ, headers=headers)


def process_tracer(headers: str | None = None) -> OtelTracer | None:
    """The process's tracer (built once, at first use, with ``headers`` if given), or ``None`` when
    telemetry is off."""
    global _process, _built
    if not _built:
        _process, _built = tracer_from_env(headers=headers), True
    return _process


def flush() -> None:
    """Export what the process's tracer recorded (bounded; never raises). Nothing to do when off."""
    if _process is not None:
        _process.flush()


def reset() -> None:
    """Forget the process's tracer (tests)."""
    global _process, _built
    _process, _built = None, False
