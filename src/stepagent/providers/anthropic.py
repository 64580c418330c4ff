"""Anthropic Messages API provider (``anthropic:<model>``): pure translation both ways, thin streaming I/O.

Request (:func:`anthropic_body`), byte-identical to what the official ``anthropic`` SDK sends for the same
``messages.create(..., stream=True)`` call (tests compare both through mock transports):

- Top-level keys in the SDK's order: ``max_tokens, messages, model, stream, system, thinking,
  tool_choice, tools``; ``max_tokens`` is the request's output limit (``STEPAGENT_MAX_TOKENS``, else the
  model's maximum output). A configured temperature (``STEPAGENT_TEMPERATURE``) comes last, as the SDK
  (2.x, which dropped the sampling parameters) sends it through ``extra_body``; it is accepted by the API
  version this provider speaks (2023-06-01) for models that still take one.
- The conversation comes from :func:`~stepagent.providers.requests_common.conversation` (alternating roles,
  every call answered, no empty text, thinking first in its assistant message). Blocks: ``text``,
  ``image`` (base64 source), ``thinking`` (with ``signature``), ``redacted_thinking``, ``tool_use``,
  ``tool_result`` (always a list of text/image blocks).
- Prompt caching: ``cache_control: {"type": "ephemeral"}`` on the system prompt, the last tool and the
  last cacheable block of the last message (three of the four allowed breakpoints), so each request
  reuses the prefix cached by the one before. A request whose ``cache_ttl`` is ``1h`` marks all three
  ``{"type": "ephemeral", "ttl": "1h"}``, so the prefix outlives a wait longer than five minutes.
- With tools, ``tool_choice`` is ``auto`` with parallel tool use disabled: the engine acts on one call per
  round, so a second parallel call would only be thrown away.

Stream (:class:`AnthropicStreamParser`): ``message_start``/``content_block_*``/``message_delta``/
``message_stop`` become text, thinking (with signature), redacted thinking, streamed tool-call arguments
and one ``Final`` with usage (input, output, cache read and cache write tokens). An ``error`` event raises
a ProviderError classified by its type; a stream that ends before ``message_stop`` raises a retryable one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepagent.errors import ProviderError
from stepagent.messages import ToolCall
from stepagent.providers.base import (
    CacheTtl,
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningComplete,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from stepagent.providers.http import ClientHolder, post_sse, stream_cut
from stepagent.providers.json_body import JsonArray, dump_json
from stepagent.providers.requests_common import (
    ImagePart,
    Part,
    ResultContent,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    ToolUsePart,
    Turn,
    conversation,
)
from stepagent.providers.sse import SSEEvent
from stepagent.providers.strict_schema import anthropic_strict_schema
from stepagent.providers.window import TruncationReport, annotate, fit_request

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
PROVIDER = "anthropic"
_EPHEMERAL = {"type": "ephemeral"}
_EPHEMERAL_HOUR = {"type": "ephemeral", "ttl": "1h"}


def cache_control(ttl: CacheTtl) -> dict[str, str]:
    """The ``cache_control`` of every breakpoint of a request: the default (five minutes) or one hour.
    A request uses one TTL throughout, so a longer entry never follows a shorter one."""
    return dict(_EPHEMERAL_HOUR if ttl == "1h" else _EPHEMERAL)


# Error types of the Messages API (``{"type": "error", "error": {"type": ...}}``) that no retry can fix;
# the others (overloaded_error, api_error, rate_limit_error, timeout_error, ...) are transient.
NON_RETRYABLE_ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
    }
)


# ----------------------------------------------------------------------------------------------------------
# Request translation (pure)


def _content(part: ResultContent) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    return {"type": "image", "source": {"type": "base64", "media_type": part.media_type, "data": part.data}}


def _block(part: Part) -> dict[str, Any]:
    match part:
        case TextPart() | ImagePart():
            return _content(part)
        case ThinkingPart(text=text, signature=signature, redacted=redacted):
            if redacted is not None:
                return {"type": "redacted_thinking", "data": redacted}
            return {"type": "thinking", "thinking": text, "signature": signature}
        case ToolUsePart(id=call_id, name=name, arguments=arguments):
            return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
        case ToolResultPart(tool_use_id=call_id, content=content):
            return {"type": "tool_result", "tool_use_id": call_id, "content": [_content(c) for c in content]}
    raise TypeError(f"unknown part {part!r}")  # pragma: no cover - the union is exhaustive


def anthropic_messages(turns: list[Turn], ttl: CacheTtl = "5m") -> Iterator[dict[str, Any]]:
    """The Messages API ``messages`` for ``turns``, one at a time (the body streams them); the last cacheable
    block of the last message carries ``cache_control``, so the whole prefix is cached."""
    for index, turn in enumerate(turns):
        blocks = [_block(part) for part in turn.parts]
        if index == len(turns) - 1:
            # Cache the whole conversation prefix: mark the last block that may carry cache_control.
            for block in reversed(blocks):
                if block["type"] not in ("thinking", "redacted_thinking"):
                    block["cache_control"] = cache_control(ttl)
                    break
        yield {"role": turn.role, "content": blocks}


def anthropic_tools(tools: list[ToolSpec], ttl: CacheTtl = "5m") -> list[dict[str, Any]]:
    """The Messages API ``tools``; the last one carries ``cache_control``."""
    out = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]
    if out:
        out[-1]["cache_control"] = cache_control(ttl)
    return out


def anthropic_body(
    request: ModelRequest,
    model: str,
    *,
    history: list[Any] | None = None,
    thinking: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Messages API body for ``request`` (``history`` overrides ``request.history``, e.g. truncated)."""
    turns = conversation(
        request.history if history is None else history, images=request.model.supports_image_input
    )
    body: dict[str, Any] = {
        "max_tokens": request.output_limit,
        "messages": JsonArray(lambda: anthropic_messages(turns, request.cache_ttl)),
        "model": model,
    }
    if request.output_schema is not None:
        # Structured outputs: the Messages API constrains the answer's text to the schema. A pydantic class's
        # schema is closed the way the SDK does it (the API refuses open objects); a written one is the user's.
        schema = request.output_schema
        if request.output_schema_class is not None:
            schema = anthropic_strict_schema(schema, request.output_schema_class)
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    body["stream"] = True
    if request.system.strip():
        system = {"type": "text", "text": request.system, "cache_control": cache_control(request.cache_ttl)}
        body["system"] = [system]
    if thinking is not None:
        body["thinking"] = thinking
    if request.tools:
        body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        body["tools"] = anthropic_tools(request.tools, request.cache_ttl)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    return body


# ----------------------------------------------------------------------------------------------------------
# Stream translation (pure)


@dataclass(slots=True)
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    signature: str | None = None
    data: str | None = None
    tool_id: str = ""
    tool_name: str = ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def error_from_event(payload: dict[str, Any]) -> ProviderError:
    """The ProviderError for an ``error`` event in the middle of a stream."""
    error = payload.get("error")
    error = error if isinstance(error, dict) else {}
    kind = str(error.get("type") or "unknown_error")
    message = str(error.get("message") or "(no message)")
    # The request was accepted, so unknown mid-stream error types count as transient.
    retryable = kind not in NON_RETRYABLE_ERROR_TYPES
    status = 529 if kind == "overloaded_error" else None
    return ProviderError(f"{PROVIDER} stream error {kind}: {message}", retryable=retryable, status=status)


class AnthropicStreamParser:
    """Feed SSE events in order; collect the stream events they produce. Call :meth:`finish` at the end."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, int] = {}
        self._stop_reason: str | None = None
        self._response: tuple[str | None, str | None] = (None, None)  # (id, model) of message_start
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        try:
            payload = json.loads(event.data)
        except ValueError:
            raise ProviderError(
                f"{PROVIDER}: malformed stream event {event.event!r}: {event.data[:200]!r}", retryable=True
            ) from None
        if not isinstance(payload, dict):
            return []
        kind = payload.get("type", event.event)
        if kind == "error" or event.event == "error":
            raise error_from_event(payload)
        handler = _HANDLERS.get(str(kind))
        return handler(self, payload) if handler is not None else []  # ping and unknown events: ignored

    def finish(self) -> list[StreamEvent]:
        if not self._done:
            raise stream_cut(PROVIDER, "message_stop")
        return []

    def _usage_from(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            if usage.get(key) is not None:
                self._usage[key] = _int(usage[key])  # message_delta counts are cumulative

    def _message_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        message = payload.get("message")
        if isinstance(message, dict):
            self._usage_from(message.get("usage"))
            self._response = (_text_or_none(message.get("id")), _text_or_none(message.get("model")))
        return []

    def _block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        block = payload.get("content_block") or {}
        index = _int(payload.get("index"))
        kind = str(block.get("type", ""))
        state = _Block(kind)
        self._blocks[index] = state
        if kind == "text" and block.get("text"):
            state.text.append(str(block["text"]))
            return [TextDelta(str(block["text"]))]
        if kind == "thinking":
            if block.get("signature"):
                state.signature = str(block["signature"])
            if block.get("thinking"):
                state.text.append(str(block["thinking"]))
                return [ReasoningDelta(str(block["thinking"]))]
        if kind == "redacted_thinking":
            state.data = str(block.get("data", ""))
        if kind == "tool_use":
            state.tool_id = str(block.get("id", ""))
            state.tool_name = str(block.get("name", ""))
            return [ToolCallDelta(name=state.tool_name)]
        return []

    def _block_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        delta = payload.get("delta") or {}
        state = self._blocks.get(_int(payload.get("index")))
        if state is None:
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = str(delta.get("text", ""))
            state.text.append(text)
            return [TextDelta(text)] if text else []
        if kind == "thinking_delta":
            text = str(delta.get("thinking", ""))
            state.text.append(text)
            return [ReasoningDelta(text)] if text else []
        if kind == "signature_delta":
            state.signature = (state.signature or "") + str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            fragment = str(delta.get("partial_json", ""))
            state.text.append(fragment)
            return [ToolCallDelta(arguments_delta=fragment)] if fragment else []
        return []

    def _block_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        state = self._blocks.pop(_int(payload.get("index")), None)
        if state is None:
            return []
        if state.kind == "thinking":
            return [ReasoningComplete(text="".join(state.text), signature=state.signature)]
        if state.kind == "redacted_thinking":
            return [ReasoningComplete(text="", redacted=state.data)]
        if state.kind == "tool_use":
            return [
                ToolCallComplete(ToolCall(id=state.tool_id, name=state.tool_name, arguments=_args(state)))
            ]
        return []

    def _message_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        delta = payload.get("delta") or {}
        if delta.get("stop_reason"):
            self._stop_reason = str(delta["stop_reason"])
        self._usage_from(payload.get("usage"))
        return []

    def _message_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._done = True
        usage = Usage(
            input_tokens=self._usage.get("input_tokens", 0),
            output_tokens=self._usage.get("output_tokens", 0),
            cache_read_tokens=self._usage.get("cache_read_input_tokens", 0),
            cache_write_tokens=self._usage.get("cache_creation_input_tokens", 0),
        )
        response_id, response_model = self._response
        return [
            Final(
                usage=usage,
                stop_reason=self._stop_reason,
                response_id=response_id,
                response_model=response_model,
            )
        ]


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _args(state: _Block) -> dict[str, Any]:
    raw = "".join(state.text).strip()
    if not raw:
        return {}
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        # Usually an output cut by max_tokens; a fresh attempt can succeed.
        raise ProviderError(
            f"{PROVIDER}: the model produced invalid arguments for tool {state.tool_name!r}: {raw[:200]!r}",
            retryable=True,
        )
    return arguments


_HANDLERS = {
    "message_start": AnthropicStreamParser._message_start,
    "content_block_start": AnthropicStreamParser._block_start,
    "content_block_delta": AnthropicStreamParser._block_delta,
    "content_block_stop": AnthropicStreamParser._block_stop,
    "message_delta": AnthropicStreamParser._message_delta,
    "message_stop": AnthropicStreamParser._message_stop,
}


# ----------------------------------------------------------------------------------------------------------
# The provider (thin I/O)


class AnthropicProvider:
    """``ModelProvider`` for the Anthropic Messages API. ``http_client`` is injectable (tests use a
    ``MockTransport``); ``thinking`` (e.g. ``{"type": "adaptive"}``) is sent as is when given."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        info: ModelInfo,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        thinking: dict[str, Any] | None = None,
    ) -> None:
        self._model = model
        self._api_key = api_key
        self._info = info
        self._url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
        self._clients = ClientHolder(http_client)
        self._thinking = thinking
        self.last_truncation: TruncationReport | None = None

    @property
    def info(self) -> ModelInfo:
        return self._info

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The body :meth:`stream` sends for ``request`` (after window truncation; messages are a
        :class:`~stepagent.providers.json_body.JsonArray`)."""
        history, self.last_truncation = fit_request(request)
        return anthropic_body(request, self._model, history=history, thinking=self._thinking)

    def request_bytes(self, request: ModelRequest) -> bytes:
        """The exact bytes :meth:`stream` sends for ``request``."""
        return dump_json(self.request_body(request))

    def headers(self) -> dict[str, str]:
        return {
            "x-api-key": self._api_key,
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        body = self.request_body(request)
        truncation = self.last_truncation
        parser = AnthropicStreamParser()
        events = post_sse(self._clients.get(), PROVIDER, self._url, self.headers(), body)
        async with aclosing(events):  # closes the response at once, also when the consumer stops early
            async for event in events:
                for out in parser.feed(event):
                    yield annotate(out, truncation)
                if parser.done:
                    return
        parser.finish()

    async def aclose(self) -> None:
        await self._clients.aclose()
