"""Whether OpenTelemetry is on, and the process's one tracer — without importing OpenTelemetry when off.

Guarantees:

- **Off unless the standard variables say so.** :func:`enabled` is true only when
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and
  ``OTEL_SDK_DISABLED`` is not ``true``, and ``OTEL_TRACES_EXPORTER`` is not ``none``). Nothing else reads
  the variables, so with them unset :func:`tracer_from_env` returns ``None`` and no OpenTelemetry module is
  ever imported (the cold start pays nothing).
- **One tracer per process** (:func:`process_tracer`): built at first use from ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS`` and the endpoint, exporting OTLP over HTTP
  (:mod:`stepagent.telemetry.otel`). :func:`flush` exports what the invocation recorded, bounded by the
  export timeout, and never raises.
- ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` lets spans carry message content; anything
  else keeps it off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepagent.telemetry.otel import OtelTracer

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

_process: OtelTracer | None = None
_built = False


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for an OTLP trace exporter (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def captures_content(environ: Mapping[str, str] | None = None) -> bool:
    """Whether spans may carry message content (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``)."""
    env = os.environ if environ is None else environ
    return env.get(CAPTURE_CONTENT, "").strip().lower() == "true"


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
