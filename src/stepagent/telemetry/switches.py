"""What the standard OpenTelemetry variables ask for: tracing on or off, message content in spans or not.

Guarantees:

- Pure reads of the environment (or of a mapping given instead), no OpenTelemetry import: the package
  (:mod:`stepagent.telemetry`, which decides whether to build a tracer) and the tracer
  (:mod:`stepagent.telemetry.otel`, which decides what its spans carry) both read the switches here, so
  neither imports the other to learn them.
- :func:`enabled` is true only when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
  is set, ``OTEL_SDK_DISABLED`` is not ``true`` and ``OTEL_TRACES_EXPORTER`` is not ``none``.
- :func:`captures_content` is true only for ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``;
  anything else keeps message content out of spans.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


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
