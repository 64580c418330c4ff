"""The tracing port: spans around model calls and tool dispatches, and the one way the engine opens them.

Guarantees:

- **Tracing never changes a step.** :func:`traced` runs its body exactly once whatever the tracer does: an
  error while starting, annotating or ending a span is logged and swallowed, and the body's own exceptions
  propagate unchanged (recorded on the span first).
- **Off by default.** With no tracer configured (``None``) nothing at all happens.
- **Safe for concurrent tasks.** The port hands each span object back to its caller, so an implementation
  needs no ambient "current span" shared between the asyncio tasks of one batch (the X-Ray SDK's
  thread-local context stack is exactly such a shared stack; :mod:`stepagent.aws.tracing` avoids it).

Span names: ``model`` (one model call, annotations ``thread_id``, ``model``) and ``tool`` (a tool's
dispatch or inline run, annotations ``thread_id``, ``tool_call_id``, ``tool``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Protocol

log = logging.getLogger(__name__)


class Span(Protocol):
    """An open span: record an error on it, then end it."""

    def record_error(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


class Tracer(Protocol):
    """Opens spans; ``None`` in place of a tracer turns tracing off."""

    def start_span(self, name: str, annotations: Mapping[str, str]) -> Span: ...


@asynccontextmanager
async def traced(tracer: Tracer | None, name: str, annotations: Mapping[str, str]) -> AsyncIterator[None]:
    """``async with traced(tracer, "model", {...}):`` — a span around the body (see the module docstring)."""
    if tracer is None:
        yield
        return
    span: Span | None = None
    try:
        span = tracer.start_span(name, annotations)
    except Exception:
        log.warning("could not start trace span %s", name, exc_info=True)
    try:
        yield
    except Exception as error:
        if span is not None:
            try:
                span.record_error(error)
            except Exception:
                log.warning("could not record an error on trace span %s", name, exc_info=True)
        raise
    finally:
        if span is not None:
            try:
                span.end()
            except Exception:
                log.warning("could not end trace span %s", name, exc_info=True)
