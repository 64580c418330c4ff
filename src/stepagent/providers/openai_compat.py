"""OpenAI Chat Completions provider (``openai:<model>``), for OpenAI and any compatible endpoint
(``OPENAI_BASE_URL``): pure translation both ways, thin streaming I/O.

Request (:func:`openai_body`), byte-identical to what the official ``openai`` SDK sends for the same
``chat.completions.create(..., stream=True)`` call (tests compare both through mock transports):

- Top-level keys in the SDK's order: ``model, stream, messages, max_completion_tokens | max_tokens,
  parallel_tool_calls, stream_options, temperature, tools``. ``stream_options.include_usage`` asks for
  the usage chunk; ``parallel_tool_calls: false`` (only with tools) because the engine acts on one call
  per round. An output limit is sent only when one is configured (``STEPAGENT_MAX_TOKENS``; otherwise
  the server's default is the model's maximum): as ``max_completion_tokens`` to OpenAI itself (its
  reasoning models reject ``max_tokens``), as ``max_tokens`` to a compatible server (``OPENAI_BASE_URL``
  set; older ones reject ``max_completion_tokens``) — :data:`MAX_TOKENS_FIELDS`. ``temperature`` only
  when configured.
- The conversation comes from :func:`~stepagent.providers.requests_common.conversation`. A ``system``
  message carries the system prompt. An assistant turn becomes one message: its texts joined by a blank
  line as ``content`` (omitted when there is none) and its calls as ``tool_calls`` (arguments as compact
  JSON strings). Reasoning is not sent (Chat Completions cannot take it back).
- A user turn becomes one ``tool`` message per tool result, in order, then one ``user`` message with
  the remaining text and images (``image_url`` data URIs). ``tool`` messages cannot hold images, so a
  result's images move into that user message behind a label naming the call, and the tool message says
  they follow. A user message with a single text is sent as a plain string.

Stream (:class:`OpenAIStreamParser`): content deltas, ``reasoning_content``/``reasoning`` deltas (some
compatible servers), tool-call fragments by index (completed, in index order, at ``finish_reason``),
and the usage chunk: ``prompt_tokens`` minus ``prompt_tokens_details.cached_tokens`` is
``input_tokens``, the cached part ``cache_read_tokens``. ``Final`` follows ``[DONE]`` (or a clean end
after a ``finish_reason``); an ``error`` chunk raises a classified ProviderError; a stream that ends
before ``finish_reason`` raises a retryable one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import httpx

from stepagent.errors import ConfigurationError, ProviderError
from stepagent.messages import ToolCall
from stepagent.output_schema import schema_name
from stepagent.providers.base import (
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
    TextPart,
    ToolResultPart,
    ToolUsePart,
    Turn,
    arguments_json,
    conversation,
)
from stepagent.providers.sse import SSEEvent
from stepagent.providers.strict_schema import openai_strict_schema
from stepagent.providers.window import TruncationReport, annotate, fit_request

DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "openai"
TOOL_IMAGES_FOLLOW = "[{count} image(s) from this tool result follow in the next message]"
TOOL_IMAGES_LABEL = "[image(s) from the result of tool call {id}]"

# Error types/codes of a mid-stream ``{"error": {...}}`` chunk that no retry can fix.
NON_RETRYABLE_ERRORS = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "context_length_exceeded",
        "invalid_api_key",
        "insufficient_quota",
    }
)


# ----------------------------------------------------------------------------------------------------------
# Request translation (pure)


def _image(part: ImagePart) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{part.media_type};base64,{part.data}"}}


def _user_message(parts: list[TextPart | ImagePart]) -> dict[str, Any]:
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return {"role": "user", "content": parts[0].text}
    content = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else _image(p) for p in parts]
    return {"role": "user", "content": content}


def _user_turn(turn: Turn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    rest: list[TextPart | ImagePart] = []
    for part in turn.parts:
        if isinstance(part, ToolResultPart):
            texts = [c.text for c in part.content if isinstance(c, TextPart)]
            images = [c for c in part.content if isinstance(c, ImagePart)]
            if images:
                texts.append(TOOL_IMAGES_FOLLOW.format(count=len(images)))
                rest.append(TextPart(TOOL_IMAGES_LABEL.format(id=part.tool_use_id)))
                rest.extend(images)
            messages.append({"role": "tool", "tool_call_id": part.tool_use_id, "content": "\n".join(texts)})
        elif isinstance(part, TextPart | ImagePart):
            rest.append(part)
    if rest:
        messages.append(_user_message(rest))
    return messages


def _assistant_turn(turn: Turn) -> list[dict[str, Any]]:
    texts = [p.text for p in turn.parts if isinstance(p, TextPart)]
    calls = [
        {
            "id": p.id,
            "type": "function",
            "function": {"name": p.name, "arguments": arguments_json(p.arguments)},
        }
        for p in turn.parts
        if isinstance(p, ToolUsePart)
    ]
    if not texts and not calls:
        return []  # cannot happen (reasoning is left out, blank text dropped), but never send an empty one
    message: dict[str, Any] = {"role": "assistant"}
    if texts:
        message["content"] = "\n\n".join(texts)
    if calls:
        message["tool_calls"] = calls
    return [message]


def openai_messages(system: str, turns: list[Turn]) -> Iterator[dict[str, Any]]:
    """The Chat Completions ``messages``, one at a time (the body streams them): the system prompt (unless
    blank), then ``turns``, tool results as ``tool`` messages."""
    if system.strip():
        yield {"role": "system", "content": system}
    for turn in turns:
        yield from _user_turn(turn) if turn.role == "user" else _assistant_turn(turn)


def openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The Chat Completions ``tools`` (all of type ``function``)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


#: How an output limit may be named: ``max_completion_tokens`` (OpenAI) or ``max_tokens`` (compatible servers).
MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")


def openai_body(
    request: ModelRequest,
    model: str,
    *,
    history: list[Any] | None = None,
    max_tokens_field: str = "max_completion_tokens",
) -> dict[str, Any]:
    """The Chat Completions body for ``request`` (``history`` overrides ``request.history``); a configured
    output limit is sent as ``max_tokens_field`` (one of :data:`MAX_TOKENS_FIELDS`)."""
    turns = conversation(
        request.history if history is None else history,
        images=request.model.supports_image_input,
        reasoning=False,  # Chat Completions cannot take reasoning back
    )
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "messages": JsonArray(lambda: openai_messages(request.system, turns)),
    }
    if request.max_tokens is not None:
        body[max_tokens_field] = request.max_tokens
    if request.tools:
        body["parallel_tool_calls"] = False
    if request.output_schema is not None:
        # Structured outputs: the answer's content must be JSON matching the schema.
        # A pydantic class's schema goes in the SDK's strict form, named after the class; a written one as given.
        if request.output_schema_class is not None:
            strict = openai_strict_schema(request.output_schema, request.output_schema_class)
            json_schema = {"schema": strict, "name": request.output_schema_class, "strict": True}
        else:
            json_schema = {"name": schema_name(request.output_schema), "schema": request.output_schema}
        body["response_format"] = {"type": "json_schema", "json_schema": json_schema}
    body["stream_options"] = {"include_usage": True}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.tools:
        body["tools"] = openai_tools(request.tools)
    return body


# ----------------------------------------------------------------------------------------------------------
# Stream translation (pure)


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def error_from_chunk(error: Any) -> ProviderError:
    """The ProviderError for an ``{"error": ...}`` chunk in the middle of a stream."""
    if not isinstance(error, dict):
        return ProviderError(f"{PROVIDER} stream error: {error}", retryable=True)
    kind = str(error.get("type") or "")
    code = str(error.get("code") or "")
    message = str(error.get("message") or "(no message)")
    retryable = kind not in NON_RETRYABLE_ERRORS and code not in NON_RETRYABLE_ERRORS
    label = " ".join(x for x in (kind, code) if x) or "error"
    return ProviderError(f"{PROVIDER} stream error {label}: {message}", retryable=retryable)


class OpenAIStreamParser:
    """Feed SSE events in order; call :meth:`finish` when the transport ends cleanly."""

    def __init__(self) -> None:
        self._calls: dict[int, _Call] = {}
        self._reasoning: list[str] = []
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._response_id: str | None = None
        self._response_model: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[StreamEvent]:
        data = event.data.strip()
        if data == "[DONE]":
            return self._final()
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ProviderError(
                f"{PROVIDER}: malformed stream chunk: {data[:200]!r}", retryable=True
            ) from None
        if not isinstance(chunk, dict):
            return []
        if event.event == "error" or chunk.get("error") is not None:
            raise error_from_chunk(chunk.get("error", chunk))
        out: list[StreamEvent] = []
        if self._response_id is None and isinstance(chunk.get("id"), str) and chunk["id"]:
            self._response_id = chunk["id"]
        if self._response_model is None and isinstance(chunk.get("model"), str) and chunk["model"]:
            self._response_model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and _int(choice.get("index")) == 0:
                out.extend(self._choice(choice))
        return out

    def finish(self) -> list[StreamEvent]:
        """The transport ended without ``[DONE]``: fine after a ``finish_reason``, a cut otherwise."""
        if self._done:
            return []
        if self._finish_reason is None:
            raise stream_cut(PROVIDER, "a finish_reason")
        return self._final()

    def _choice(self, choice: dict[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        delta = choice.get("delta") or {}
        # Compatible servers name it reasoning_content (DeepSeek, vLLM) or reasoning (OpenRouter); some
        # send both with the same text, so only the first one present counts.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self._reasoning.append(reasoning)
            out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            out.append(TextDelta(content))
        for fragment in delta.get("tool_calls") or []:
            out.extend(self._tool_fragment(fragment))
        reason = choice.get("finish_reason")
        if reason and self._finish_reason is None:
            self._finish_reason = str(reason)
            out.extend(self._complete_calls())
        return out

    def _tool_fragment(self, fragment: Any) -> list[StreamEvent]:
        if not isinstance(fragment, dict):
            return []
        call = self._calls.setdefault(_int(fragment.get("index")), _Call())
        out: list[StreamEvent] = []
        if fragment.get("id"):
            call.id = str(fragment["id"])
        function = fragment.get("function") or {}
        if function.get("name"):
            call.name += str(function["name"])
            out.append(ToolCallDelta(name=call.name))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)
            out.append(ToolCallDelta(arguments_delta=arguments))
        return out

    def _complete_calls(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self._reasoning:
            out.append(ReasoningComplete(text="".join(self._reasoning)))
            self._reasoning = []
        for index in sorted(self._calls):
            call = self._calls[index]
            out.append(ToolCallComplete(ToolCall(id=call.id, name=call.name, arguments=_args(call))))
        self._calls = {}
        return out

    def _final(self) -> list[StreamEvent]:
        if self._done:
            return []
        self._done = True
        out = self._complete_calls()
        out.append(
            Final(
                usage=self._usage,
                stop_reason=self._finish_reason,
                response_id=self._response_id,
                response_model=self._response_model,
            )
        )
        return out


def _usage(usage: dict[str, Any]) -> Usage:
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=max(0, prompt - cached),
        output_tokens=_int(usage.get("completion_tokens")),
        cache_read_tokens=cached,
    )


def _args(call: _Call) -> dict[str, Any]:
    raw = "".join(call.arguments).strip()
    if not raw:
        return {}
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ProviderError(
            f"{PROVIDER}: the model produced invalid arguments for tool {call.name!r}: {raw[:200]!r}",
            retryable=True,
        )
    return arguments


# ----------------------------------------------------------------------------------------------------------
# The provider (thin I/O)


class OpenAIProvider:
    """``ModelProvider`` for OpenAI-compatible Chat Completions endpoints. ``max_tokens_field`` names a
    configured output limit (default: ``max_completion_tokens`` for OpenAI itself, ``max_tokens`` when a
    ``base_url`` points at a compatible server)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        info: ModelInfo,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_tokens_field: str | None = None,
    ) -> None:
        if max_tokens_field is None:
            compatible = bool(base_url) and str(base_url).rstrip("/") != DEFAULT_BASE_URL
            max_tokens_field = MAX_TOKENS_FIELDS[1] if compatible else MAX_TOKENS_FIELDS[0]
        if max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ConfigurationError(f"max_tokens_field must be one of {MAX_TOKENS_FIELDS}")
        self._max_tokens_field = max_tokens_field
        self._model = model
        self._api_key = api_key
        self._info = info
        self._url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
        self._clients = ClientHolder(http_client)
        self.last_truncation: TruncationReport | None = None

    @property
    def info(self) -> ModelInfo:
        return self._info

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The body :meth:`stream` sends for ``request`` (after window truncation; messages are a
        :class:`~stepagent.providers.json_body.JsonArray`)."""
        history, self.last_truncation = fit_request(request)
        return openai_body(request, self._model, history=history, max_tokens_field=self._max_tokens_field)

    def request_bytes(self, request: ModelRequest) -> bytes:
        """The exact bytes :meth:`stream` sends for ``request``."""
        return dump_json(self.request_body(request))

    def headers(self) -> dict[str, str]:
        return {
            "authorization": f"Bearer {self._api_key}",
            "content-type": "application/json",
            "accept": "text/event-stream",
        }

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        body = self.request_body(request)
        truncation = self.last_truncation
        parser = OpenAIStreamParser()
        events = post_sse(self._clients.get(), PROVIDER, self._url, self.headers(), body)
        async with aclosing(events):
            async for event in events:
                for out in parser.feed(event):
                    yield annotate(out, truncation)
                if parser.done:
                    return
        for out in parser.finish():
            yield annotate(out, truncation)

    async def aclose(self) -> None:
        await self._clients.aclose()
