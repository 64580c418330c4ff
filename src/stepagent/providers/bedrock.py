"""Amazon Bedrock ConverseStream provider (``bedrock:<model id>``): pure translation, thin aioboto3 I/O.

Request (:func:`converse_params`): the ``converse_stream`` parameters, which botocore serialises to the
same bytes as for any other caller passing the same parameters (tests compare with a plain boto3 client
through a botocore event hook, no network):

- Keys in the API's order: ``modelId, messages, system, inferenceConfig, toolConfig,
  additionalModelRequestFields``. ``inferenceConfig`` is ``maxTokens`` (the request's output limit:
  ``STEPAGENT_MAX_TOKENS``, else the model's maximum output) then ``temperature`` when one is configured.
- The conversation comes from :func:`~stepagent.providers.requests_common.conversation` (alternating roles,
  starting with the user, every call answered, no empty text, reasoning first in its assistant message).
  Blocks: ``text``, ``image`` (format from the media type, source bytes decoded from base64),
  ``reasoningContent`` (``reasoningText`` with its signature, or ``redactedContent``), ``toolUse``,
  ``toolResult`` (no ``status``).
- Prompt caching, for models known to accept it (Claude, Nova; see the catalog): a ``cachePoint`` after
  the system prompt, after the tools and at the end of the last message. Unknown models get none, since
  a model without caching rejects the request. A request whose ``cache_ttl`` is ``1h`` gives its cache
  points ``"ttl": "1h"`` when the model takes one (Claude 4.5 and later, per the catalog) and the
  installed botocore knows the field (an older one would reject it); otherwise they keep the default.

Stream (:class:`BedrockStreamParser`, over the event dicts botocore yields): text, reasoning text with its
signature, redacted reasoning (bytes, kept base64-encoded), tool use with streamed JSON input, and one
``Final`` with usage including ``cacheReadInputTokens``/``cacheWriteInputTokens``. Exception events
raise classified ProviderErrors; a stream that ends before ``messageStop`` raises a retryable one.

I/O: one aioboto3 ``bedrock-runtime`` client per provider and event loop, opened by the first call on that
loop and kept (its aiohttp connector belongs to the loop; a Lambda container runs every invocation on one
loop, so one client, one TLS context and warm connections serve all its model calls) until :meth:`aclose`.
Concurrent first calls share one opening. Cancelling a call aborts its request. botocore's own retries
are off (the engine owns retries). Only ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` redirects the endpoint (passed in by the factory);
the global ``AWS_ENDPOINT_URL`` that points the stores at moto or LocalStack is deliberately ignored.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import aioboto3
import aiohttp
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from stepagent.errors import ProviderError
from stepagent.messages import ToolCall
from stepagent.output_schema import schema_instruction
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
from stepagent.providers.http import error_from_transport, is_retryable_status, parse_retry_after, stream_cut
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
    image_bytes,
)
from stepagent.providers.window import TruncationReport, annotate, fit_request

PROVIDER = "bedrock"
_CACHE_POINT = {"cachePoint": {"type": "default"}}
RETRYABLE_CODES = frozenset(
    {
        "throttlingexception",
        "serviceunavailableexception",
        "internalserverexception",
        "modelnotreadyexception",
        "modeltimeoutexception",
        "modelstreamerrorexception",
        "requesttimeout",
        "requesttimeoutexception",
    }
)
NON_RETRYABLE_CODES = frozenset(
    {
        "validationexception",
        "accessdeniedexception",
        "resourcenotfoundexception",
        "servicequotaexceededexception",
        "modelerrorexception",
        "unrecognizedclientexception",
    }
)
_EXCEPTION_KEYS = (
    "internalServerException",
    "modelStreamErrorException",
    "validationException",
    "throttlingException",
    "serviceUnavailableException",
)


# ----------------------------------------------------------------------------------------------------------
# Request translation (pure)


def _content(part: ResultContent) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    image_format = part.media_type.split("/", 1)[1]
    return {"image": {"format": image_format, "source": {"bytes": image_bytes(part.data)}}}


def redacted_bytes(redacted: str) -> bytes:
    """Stored redacted reasoning is base64 (as received from Bedrock); anything else is sent as UTF-8."""
    try:
        return base64.b64decode(redacted, validate=True)
    except (binascii.Error, ValueError):
        return redacted.encode("utf-8")


def _block(part: Part) -> dict[str, Any]:
    match part:
        case TextPart() | ImagePart():
            return _content(part)
        case ThinkingPart(text=text, signature=signature, redacted=redacted):
            if redacted is not None:
                return {"reasoningContent": {"redactedContent": redacted_bytes(redacted)}}
            reasoning: dict[str, Any] = {"text": text}
            if signature is not None:
                reasoning["signature"] = signature
            return {"reasoningContent": {"reasoningText": reasoning}}
        case ToolUsePart(id=call_id, name=name, arguments=arguments):
            return {"toolUse": {"toolUseId": call_id, "name": name, "input": arguments}}
        case ToolResultPart(tool_use_id=call_id, content=content):
            return {"toolResult": {"toolUseId": call_id, "content": [_content(c) for c in content]}}
    raise TypeError(f"unknown part {part!r}")  # pragma: no cover - the union is exhaustive


@functools.cache
def sdk_takes_cache_ttl() -> bool:
    """Whether the installed botocore's Bedrock Runtime model has ``CachePointBlock.ttl`` (it validates
    parameters against its model, so an unknown field would fail the call). Read once, when first needed."""
    import botocore.session
    from botocore.model import StructureShape

    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    shape = model.shape_for("CachePointBlock")
    return isinstance(shape, StructureShape) and "ttl" in shape.members


def cache_point(ttl: CacheTtl | None) -> dict[str, Any]:
    """A ``cachePoint`` block; with ``ttl`` ``1h`` (for models that take a TTL) the entry lasts an hour,
    otherwise the service's default (five minutes) applies and no ``ttl`` is sent."""
    if ttl == "1h":
        return {"cachePoint": {"type": "default", "ttl": "1h"}}
    return {"cachePoint": dict(_CACHE_POINT["cachePoint"])}


def converse_messages(turns: list[Turn], *, cache: bool, ttl: CacheTtl | None = None) -> list[dict[str, Any]]:
    """The Converse API ``messages`` for ``turns``; with ``cache``, a ``cachePoint`` block ends the last."""
    messages: list[dict[str, Any]] = [
        {"role": turn.role, "content": [_block(part) for part in turn.parts]} for turn in turns
    ]
    if cache and messages:
        messages[-1]["content"].append(cache_point(ttl))
    return messages


def converse_tools(
    tools: list[ToolSpec], *, cache: bool, ttl: CacheTtl | None = None
) -> list[dict[str, Any]]:
    """The Converse API ``toolConfig`` tools; with ``cache``, a ``cachePoint`` follows the last one."""
    out: list[dict[str, Any]] = [
        {"toolSpec": {"name": t.name, "description": t.description, "inputSchema": {"json": t.parameters}}}
        for t in tools
    ]
    if cache and out:
        out.append(cache_point(ttl))
    return out


def converse_params(
    request: ModelRequest,
    model_id: str,
    *,
    history: list[Any] | None = None,
    cache: bool = True,
    additional_fields: Mapping[str, Any] | None = None,
    cache_ttl: bool = False,
) -> dict[str, Any]:
    """The ``converse_stream`` keyword arguments for ``request``; ``cache_ttl``: the model takes a TTL on
    its cache points (``request.cache_ttl`` is then sent when it is not the default)."""
    ttl = request.cache_ttl if cache_ttl else None
    turns = conversation(
        request.history if history is None else history, images=request.model.supports_image_input
    )
    params: dict[str, Any] = {"modelId": model_id, "messages": converse_messages(turns, cache=cache, ttl=ttl)}
    system = request.system
    if request.output_schema is not None:
        # Converse's structured-output field (outputConfig) is newer than the pinned botocore, which would
        # reject it: the schema goes into the system prompt and the runtime validates the answer.
        system = f"{system}\n\n{schema_instruction(request.output_schema)}".strip()
    if system.strip():
        params["system"] = [{"text": system}, *([cache_point(ttl)] if cache else [])]
    inference: dict[str, Any] = {"maxTokens": request.output_limit}
    if request.temperature is not None:
        inference["temperature"] = request.temperature
    params["inferenceConfig"] = inference
    if request.tools:
        params["toolConfig"] = {"tools": converse_tools(request.tools, cache=cache, ttl=ttl)}
    if additional_fields:
        params["additionalModelRequestFields"] = dict(additional_fields)
    return params


# ----------------------------------------------------------------------------------------------------------
# Errors


def error_from_code(
    code: str, message: str, *, status: int | None = None, retry_after: float | None = None
) -> ProviderError:
    """The :class:`~stepagent.errors.ProviderError` for a Bedrock error ``code``.

    Retryable by the code lists, else by the HTTP ``status`` (unknown: retryable). A refusal of on-demand
    throughput is not retryable, and its message says to use an inference profile id."""
    lowered = code.lower()
    if lowered in RETRYABLE_CODES:
        retryable = True
    elif lowered in NON_RETRYABLE_CODES:
        retryable = False
    else:
        retryable = is_retryable_status(status) if status is not None else True
    if "on-demand throughput" in message.lower():
        # Current Claude models are served on demand only through a cross-region inference profile.
        message += (
            " - use the inference profile id instead of the bare model id: prefix it with us., eu., apac. "
            "or global. (e.g. bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0)"
        )
        retryable = False
    return ProviderError(
        f"{PROVIDER} error {code}: {message}", retryable=retryable, status=status, retry_after=retry_after
    )


def error_from_client_error(error: ClientError) -> ProviderError:
    """The :class:`~stepagent.errors.ProviderError` for a botocore ``ClientError`` (its code, message, HTTP
    status and ``Retry-After``)."""
    response: dict[str, Any] = getattr(error, "response", None) or {}
    details = response.get("Error") or {}
    metadata = response.get("ResponseMetadata") or {}
    status = metadata.get("HTTPStatusCode")
    headers = metadata.get("HTTPHeaders") or {}
    return error_from_code(
        str(details.get("Code") or "UnknownError"),
        str(details.get("Message") or error),
        status=status if isinstance(status, int) else None,
        retry_after=parse_retry_after(headers) if isinstance(headers, Mapping) else None,
    )


# ----------------------------------------------------------------------------------------------------------
# Stream translation (pure)


@dataclass(slots=True)
class _Block:
    kind: str = "text"
    text: list[str] = field(default_factory=list)
    signature: str | None = None
    redacted: bytearray | None = None
    tool_id: str = ""
    tool_name: str = ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class BedrockStreamParser:
    """Feed ConverseStream events (dicts as botocore yields them); call :meth:`finish` at the end."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self._stopped = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        for key in _EXCEPTION_KEYS:
            if key in event:
                body = event[key] if isinstance(event[key], Mapping) else {}
                raise error_from_code(key[0].upper() + key[1:], str(body.get("message") or "(no message)"))
        if "contentBlockStart" in event:
            return self._start(event["contentBlockStart"])
        if "contentBlockDelta" in event:
            return self._delta(event["contentBlockDelta"])
        if "contentBlockStop" in event:
            return self._stop(event["contentBlockStop"])
        if "messageStop" in event:
            self._stopped = True
            self._stop_reason = str(event["messageStop"].get("stopReason") or "") or None
            return []
        if "metadata" in event:
            return self._metadata(event["metadata"])
        return []  # messageStart and anything newer

    def finish(self) -> list[StreamEvent]:
        if self._done:
            return []
        if not self._stopped:
            raise stream_cut(PROVIDER, "messageStop")
        self._done = True
        return [Final(usage=None, stop_reason=self._stop_reason)]

    def _start(self, start_event: Mapping[str, Any]) -> list[StreamEvent]:
        start = start_event.get("start") or {}
        tool = start.get("toolUse")
        block = self._blocks.setdefault(_int(start_event.get("contentBlockIndex")), _Block())
        if isinstance(tool, Mapping):
            block.kind = "tool"
            block.tool_id = str(tool.get("toolUseId", ""))
            block.tool_name = str(tool.get("name", ""))
            return [ToolCallDelta(name=block.tool_name)]
        return []

    def _delta(self, delta_event: Mapping[str, Any]) -> list[StreamEvent]:
        delta = delta_event.get("delta") or {}
        block = self._blocks.setdefault(_int(delta_event.get("contentBlockIndex")), _Block())
        if "text" in delta:
            text = str(delta["text"])
            return [TextDelta(text)] if text else []
        if "toolUse" in delta:
            fragment = str((delta["toolUse"] or {}).get("input", ""))
            block.text.append(fragment)
            return [ToolCallDelta(arguments_delta=fragment)] if fragment else []
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, Mapping):
            block.kind = "reasoning"
            if reasoning.get("text"):
                block.text.append(str(reasoning["text"]))
                return [ReasoningDelta(str(reasoning["text"]))]
            if reasoning.get("signature"):
                block.signature = (block.signature or "") + str(reasoning["signature"])
            redacted = reasoning.get("redactedContent")
            if isinstance(redacted, bytes | bytearray):
                block.redacted = (block.redacted or bytearray()) + redacted
        return []

    def _stop(self, stop_event: Mapping[str, Any]) -> list[StreamEvent]:
        block = self._blocks.pop(_int(stop_event.get("contentBlockIndex")), None)
        if block is None:
            return []
        if block.kind == "tool":
            return [
                ToolCallComplete(ToolCall(id=block.tool_id, name=block.tool_name, arguments=_args(block)))
            ]
        if block.kind == "reasoning":
            if block.redacted is not None:
                encoded = base64.b64encode(bytes(block.redacted)).decode("ascii")
                return [ReasoningComplete(text="", redacted=encoded)]
            return [ReasoningComplete(text="".join(block.text), signature=block.signature)]
        return []

    def _metadata(self, metadata: Mapping[str, Any]) -> list[StreamEvent]:
        usage = metadata.get("usage") or {}
        self._done = True
        final = Final(
            usage=Usage(
                input_tokens=_int(usage.get("inputTokens")),
                output_tokens=_int(usage.get("outputTokens")),
                cache_read_tokens=_int(usage.get("cacheReadInputTokens")),
                cache_write_tokens=_int(usage.get("cacheWriteInputTokens")),
            ),
            stop_reason=self._stop_reason,
        )
        return [final]


def _args(block: _Block) -> dict[str, Any]:
    raw = "".join(block.text).strip()
    if not raw:
        return {}
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ProviderError(
            f"{PROVIDER}: the model produced invalid arguments for tool {block.tool_name!r}: {raw[:200]!r}",
            retryable=True,
        )
    return arguments


# ----------------------------------------------------------------------------------------------------------
# The provider (thin I/O)

_TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, asyncio.TimeoutError, OSError)


class _LoopClients:
    """One client per event loop from ``opener`` (an async context manager factory), opened on first use.

    The entry of a closed loop is dropped at the next call (its client cannot be closed from another
    loop). Concurrent first callers await one opening; a caller cancelled meanwhile does not cancel it
    for the others, and a failed opening is not kept."""

    def __init__(self, opener: Any) -> None:
        self._opener = opener
        self._open: dict[asyncio.AbstractEventLoop, asyncio.Task[tuple[Any, AsyncExitStack]]] = {}

    async def get(self) -> Any:
        loop = asyncio.get_running_loop()
        for gone in [other for other in self._open if other.is_closed()]:
            del self._open[gone]
        opening = self._open.get(loop)
        if opening is None:
            opening = self._open[loop] = loop.create_task(self._enter())
        try:
            client, _ = await asyncio.shield(opening)
        except BaseException:
            if opening.done() and (opening.cancelled() or opening.exception() is not None):
                self._open.pop(loop, None)
            raise
        return client

    async def _enter(self) -> tuple[Any, AsyncExitStack]:
        stack = AsyncExitStack()
        client = await stack.enter_async_context(self._opener())
        return client, stack

    async def aclose(self) -> None:
        """Close the running loop's client, if one was opened."""
        opening = self._open.pop(asyncio.get_running_loop(), None)
        if opening is None:
            return
        try:
            _, stack = await opening
        except Exception:  # it never opened: nothing to close
            return
        await stack.aclose()


class BedrockProvider:
    """``ModelProvider`` for Bedrock ConverseStream."""

    def __init__(
        self,
        model_id: str,
        *,
        info: ModelInfo,
        region: str,
        endpoint_url: str | None = None,
        session: Any = None,
        prompt_cache: bool = True,
        additional_fields: Mapping[str, Any] | None = None,
        cache_ttl: bool = False,
    ) -> None:
        self._model_id = model_id
        self._info = info
        self._region = region
        self._endpoint_url = endpoint_url
        self._session = session if session is not None else aioboto3.Session(region_name=region)
        self._cache = prompt_cache
        self._cache_ttl = cache_ttl  # whether the model takes a TTL on its cache points
        self._additional = dict(additional_fields) if additional_fields else None
        # No botocore retries: the engine's RetryPolicy owns them (bounded by the Lambda's remaining time).
        self._config = Config(
            retries={"total_max_attempts": 1},
            connect_timeout=10,
            read_timeout=300,
            # botocore takes it (since 1.31.32); the stubs do not list it yet
            ignore_configured_endpoint_urls=True,  # type: ignore[call-arg]
        )
        kwargs: dict[str, Any] = {"region_name": region, "config": self._config}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        self._clients = _LoopClients(lambda: self._session.client("bedrock-runtime", **kwargs))
        self.last_truncation: TruncationReport | None = None

    @property
    def info(self) -> ModelInfo:
        return self._info

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The exact ``converse_stream`` arguments :meth:`stream` sends (after window truncation)."""
        history, self.last_truncation = fit_request(request)
        return converse_params(
            request,
            self._model_id,
            history=history,
            cache=self._cache,
            additional_fields=self._additional,
            cache_ttl=self._cache_ttl and request.cache_ttl == "1h" and sdk_takes_cache_ttl(),
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params = self.request_params(request)
        truncation = self.last_truncation
        parser = BedrockStreamParser()
        try:
            client = await self._clients.get()
        except _TRANSPORT_ERRORS as exc:  # opening the client (credentials, endpoint)
            raise error_from_transport(PROVIDER, exc, during_stream=False) from exc
        try:
            response = await client.converse_stream(**params)
        except ClientError as exc:
            raise error_from_client_error(exc) from exc
        except _TRANSPORT_ERRORS as exc:
            raise error_from_transport(PROVIDER, exc, during_stream=False) from exc
        stream = response["stream"]
        try:
            async for event in stream:
                for out in parser.feed(event):
                    yield annotate(out, truncation)
                if parser.done:
                    break
        except ClientError as exc:  # EventStreamError: an exception event
            raise error_from_client_error(exc) from exc
        except _TRANSPORT_ERRORS as exc:
            raise error_from_transport(PROVIDER, exc, during_stream=True) from exc
        finally:
            # Done, failed, cancelled or abandoned by the consumer: the response goes back (or, unread,
            # its connection is dropped), so the kept client's pool never fills with half-read streams.
            stream.close()
        if parser.done:
            return
        for out in parser.finish():
            yield annotate(out, truncation)

    async def aclose(self) -> None:
        """Close this loop's client (the runtime calls it when it closes)."""
        await self._clients.aclose()
