"""The tracing port: spans around steps, model calls and tool runs, and the trace context every queued
message carries, with nothing of OpenTelemetry imported here.

Guarantees:

- **Tracing never changes a step.** :func:`traced` runs its body exactly once whatever the tracer does: an
  error while starting, annotating or ending a span is logged and swallowed, and the body's own exceptions
  propagate unchanged (recorded on the span first).
- **Off by default, and free when off.** With no tracer configured (``None``) no span exists and the trace
  context is whatever the caller set (usually nothing): one context-variable read per send.
- **Safe for concurrent tasks.** The current trace context is a :class:`~contextvars.ContextVar`: every
  asyncio task (one per thread of a batch, one per tool-runner record) sees its own, and a span's children
  are exactly the spans opened inside its ``async with`` block.
- **One W3C currency.** A span's context is its W3C ``traceparent`` string. :func:`current_traceparent` is
  what a sender stamps on an outgoing message (:data:`TRACEPARENT`, a message attribute or an HTTP
  header); :func:`continuing` makes a received one the parent of the spans opened inside it.
- **Turns are flat, not staircases.** What an outgoing message carries is the *turn's* context, not the
  innermost open span: the context a step received (:func:`continuing`), or the one the step that starts a
  turn names with :func:`carrying_turn` (its own ``invoke_agent`` span). So every later step, tool run and
  child step of the turn is a child of the turn's first ``invoke_agent`` span — siblings, however many
  steps the turn takes — while spans opened inside a step still nest under that step's spans.

Span names and attributes follow the OpenTelemetry GenAI conventions: ``invoke_agent`` (one step),
``chat {model}`` (one model call), ``execute_tool {name}`` (one tool run or dispatch).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Protocol

log = logging.getLogger(__name__)

#: The message attribute (SQS) and HTTP header (RAP) name of the W3C trace context.
TRACEPARENT = "traceparent"
_TRACEPARENT_FORMAT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

AttributeValue = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, AttributeValue]

_current: ContextVar[str | None] = ContextVar("stepagent_traceparent", default=None)
#: The context outgoing messages carry (the turn's anchor span); ``None``: the current span's.
_turn: ContextVar[str | None] = ContextVar("stepagent_turn_traceparent", default=None)


class Span(Protocol):
    """An open span: annotate it, record an error on it, then end it."""

    @property
    def traceparent(self) -> str | None: ...

    def set_attributes(self, attributes: Attributes) -> None: ...

    def record_error(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


class Tracer(Protocol):
    """Opens spans; ``None`` in place of a tracer turns tracing off.

    ``parent`` is the W3C ``traceparent`` of the parent span (``None``: a new trace); ``seed``, for a span
    without a parent, makes its trace id a function of the seed (a redelivered input then re-emits its
    spans into the trace its first delivery started). ``capture_content``: whether message content may be
    recorded on spans."""

    capture_content: bool

    def start_span(
        self, name: str, attributes: Attributes, parent: str | None, seed: str | None = None
    ) -> Span: ...


class _NoSpan:
    """What the body of :func:`traced` gets when there is no span: every call does nothing."""

    traceparent: str | None = None

    def set_attributes(self, attributes: Attributes) -> None:
        return None

    def record_error(self, error: BaseException) -> None:
        return None

    def end(self) -> None:
        return None


NO_SPAN = _NoSpan()


class _GuardedSpan:
    """A span whose annotation errors are logged, never raised into the step."""

    def __init__(self, span: Span, name: str) -> None:
        self._span = span
        self._name = name

    @property
    def traceparent(self) -> str | None:
        try:
            return self._span.traceparent
        except Exception:
            log.warning("could not read the context of trace span %s", self._name, exc_info=True)
            return None

    def set_attributes(self, attributes: Attributes) -> None:
        try:
            self._span.set_attributes(attributes)
        except Exception:
            log.warning("could not annotate trace span %s", self._name, exc_info=True)

    def record_error(self, error: BaseException) -> None:
        try:
            self._span.record_error(error)
        except Exception:
            log.warning("could not record an error on trace span %s", self._name, exc_info=True)

    def end(self) -> None:
        try:
            self._span.end()
        except Exception:
            log.warning("could not end trace span %s", self._name, exc_info=True)


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a well-formed W3C ``traceparent`` (version 00 shape), else ``None``: a malformed
    header from outside never breaks a step, it only starts a new trace."""
    if isinstance(value, str) and _TRACEPARENT_FORMAT.match(value.strip()):
        return value.strip()
    return None


def current_traceparent() -> str | None:
    """The trace context of the running task's turn: what an outgoing message carries."""
    return _turn.get() or _current.get()


def trace_attributes() -> dict[str, str]:
    """``{"traceparent": ...}`` for an outgoing message, or ``{}`` when there is no trace."""
    parent = current_traceparent()
    return {TRACEPARENT: parent} if parent else {}


@contextmanager
def continuing(traceparent: str | None) -> Iterator[None]:
    """Within the block, spans are children of ``traceparent`` and sends carry it (``None``: a new trace,
    and sends carry nothing until a span opens)."""
    valid = valid_traceparent(traceparent)
    token, turn = _current.set(valid), _turn.set(valid)
    try:
        yield
    finally:
        _turn.reset(turn)
        _current.reset(token)


@contextmanager
def carrying_turn(traceparent: str | None) -> Iterator[None]:
    """Within the block, outgoing messages carry ``traceparent`` (the turn's first ``invoke_agent``
    span), whatever span is open when they are sent. ``None`` changes nothing."""
    if traceparent is None:
        yield
        return
    token = _turn.set(traceparent)
    try:
        yield
    finally:
        _turn.reset(token)


def capture_content(tracer: Tracer | None) -> bool:
    """Whether ``tracer`` may record message content (off unless it says so)."""
    return tracer is not None and bool(getattr(tracer, "capture_content", False))


@asynccontextmanager
async def traced(
    tracer: Tracer | None, name: str, attributes: Attributes, *, seed: str | None = None
) -> AsyncIterator[Span]:
    """``async with traced(tracer, "chat m", {...}) as span:`` — a span around the body, the child of the
    current context, which is the current context inside (see the module docstring)."""
    if tracer is None:
        yield NO_SPAN
        return
    span: Span = NO_SPAN
    try:
        span = _GuardedSpan(tracer.start_span(name, attributes, _current.get(), seed), name)
    except Exception:
        log.warning("could not start trace span %s", name, exc_info=True)
    token = _current.set(span.traceparent or _current.get())
    try:
        yield span
    except Exception as error:
        span.record_error(error)
        raise
    finally:
        _current.reset(token)
        span.end()


# ---- GenAI semantic conventions -------------------------------------------------------------------------


def step_attributes(thread_id: str) -> dict[str, AttributeValue]:
    """The attributes an ``invoke_agent`` span has from its start."""
    return {"gen_ai.operation.name": "invoke_agent", "stepagent.thread_id": thread_id}


#: ``gen_ai.provider.name`` of each ``STEPAGENT_MODEL`` provider prefix (the conventions' well-known values).
PROVIDER_NAMES = {"anthropic": "anthropic", "openai": "openai", "bedrock": "aws.bedrock"}


def genai_model(provider: str, model_id: str) -> tuple[str, str]:
    """``(gen_ai.provider.name, gen_ai.request.model)`` of a model: the conventions' provider value and the
    model id as the provider knows it. A model without a provider whose id names its kind (the scripted
    model's ``scripted:/path/demo.json``, a test double's ``function:name``) is that kind, and the script
    file's stem (``demo``) or the name: never a file path."""
    if provider:
        return PROVIDER_NAMES.get(provider, provider), model_id
    kind, colon, rest = model_id.partition(":")
    if colon and kind and rest:
        stem = rest.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return kind, stem.rsplit(".", 1)[0] if stem.endswith(".json") else stem
    return "stepagent", model_id


def chat_attributes(provider: str, model_id: str, thread_id: str) -> dict[str, AttributeValue]:
    """The attributes a ``chat {model}`` span has from its start (see :func:`genai_model`)."""
    provider_name, request_model = genai_model(provider, model_id)
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider_name,
        "gen_ai.request.model": request_model,
        "stepagent.thread_id": thread_id,
    }


def response_attributes(response_id: str | None, response_model: str | None) -> dict[str, AttributeValue]:
    """``gen_ai.response.id`` / ``gen_ai.response.model``, those the provider returned."""
    attributes: dict[str, AttributeValue] = {}
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if response_model:
        attributes["gen_ai.response.model"] = response_model
    return attributes


def usage_attributes(
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
    finish_reason: str | None,
) -> dict[str, AttributeValue]:
    """A finished model call's token usage and finish reason."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": cache_write_tokens,
    }
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    return attributes


def tool_attributes(name: str, tool_call_id: str, thread_id: str) -> dict[str, AttributeValue]:
    """The attributes of an ``execute_tool {name}`` span."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": tool_call_id,
        "stepagent.thread_id": thread_id,
    }
